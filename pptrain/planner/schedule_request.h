// A run's schedule, described once and resolved by one function: `pptrain schedule`, `train`,
// `compare`, the C++ library's PipelineSchedule and Python all describe the schedule they want
// as a ScheduleRequest and call make_requested_schedule(), so every rule of what runs (the
// reductions of copies and replicas, the weight rule, skips, validation) and every check of the
// options is stated here once, with the same errors.
//
//   ScheduleRequest request;
//   request.schedule = "zb-v";
//   request.pp = 4;
//   request.microbatches = 8;
//   const CostModel cost = cost_model_from_flags("F=1,I=1,W=1,comm=0", 0.5);
//   RequestedSchedule made = make_requested_schedule(request, cost);
//   SimResult result = simulate_requested(made, cost, request.memory_limit, Record::kTimeline);
//   std::cout << schedule_summary_json(made, cost, request.memory_limit, result).dump();
//
// A request names a registry schedule (`schedule`; PipeDream's round robin takes the replicas
// of its stages, `replicas`), or a CSV file (`file`); `one_process` asks for
// the one-process reference of a registry schedule instead. A schedule already in hand (the
// planner's, a CSV text) goes through prepare_schedule(), the same resolution without the
// making.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/generators/ilp_schedule.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"

namespace pptrain {

// PipeDream's round robin, the registry entry that takes `replicas` (a partition's).
constexpr const char* kRoundRobinSchedule = "1f1b-rr";

// What the errors call each option of a run (this request's and run_request.h's): `pptrain`'s
// flags, unless a caller (the C++ library) names them otherwise.
struct OptionNames {
  std::string schedule = "--schedule";
  std::string pp = "--pp";
  std::string microbatches = "--microbatches";
  std::string chunks = "--chunks";
  std::string steps = "--steps";
  std::string dp = "--dp";
  std::string dp_shares = "--dp-shares";
  std::string skips = "the skip connections";
  std::string zero = "--zero";
  std::string optimizer = "--optimizer";
  std::string lr = "--lr";
  std::string momentum = "--momentum";
  std::string warmup_steps = "--warmup-steps";
  std::string clip = "--clip";
  std::string post_validation = "--post-validation";
  std::string exact_rollback = "--exact-rollback";
  // A tied parameter, by its name; empty: "tied parameter 'NAME'".
  std::string tie;
};

struct ScheduleRequest {
  std::string schedule;  // a registry name
  // A schedule CSV (docs/SCHEDULE_FORMAT.md), which wins over `schedule`; `pp`, `microbatches`
  // and `chunks`, when given, must match it. `file_name`: what its schedule is called (empty:
  // the file's stem, "dir/1f1b.csv" -> "1f1b").
  std::string file;
  std::string file_name;
  std::optional<int> pp;            // P: required, except for a file and 1f1b-rr's replicas
  std::optional<int> microbatches;  // M per mini-batch: required, except for a file
  int chunks = 0;                   // V: stages per rank; 0: the schedule's default
  std::vector<int> replicas;        // 1f1b-rr only: replicas of each stage, {3, 1}; empty: 1 each
  int steps = 3;                    // an asynchronous schedule: mini-batches in one run, no flush
  // The one-process reference of `schedule` (`pptrain train --pp 1`): `stages` stages (0: one)
  // on one rank, one microbatch after the other; a synchronous schedule on one stage runs all
  // the forwards, then all the backwards.
  bool one_process = false;
  int stages = 0;
  // The options of the schedule's family that were given, checked against it
  // (check_family_options) and set in its weight rule.
  FamilyValues family;
  int dp = 1;  // D: data-parallel copies; > 1 adds REDUCE_GRADs
  // Cap on every rank's peak activations (memory-model units); zb-auto plans under it, any
  // schedule above it is refused after simulation. 0: none.
  double memory_limit = 0;
  ScheduleSolver solver = ScheduleSolver::kHeuristic;  // zb-auto only
  double time_limit_s = 60;                            // kIlp: CBC's wall-time limit, seconds
  // zb-auto's order solved already (a CSV the launcher wrote: a time limit could end
  // differently in each process), read instead of solving. Empty: solve.
  std::string solved_file;
  // Skip connections between stages (Schedule::skips), in any order; lowering adds their
  // messages. ScheduleError (one line) for a skip that does not pass a stage. Set, a file's own
  // skip messages must be these; unset, a file keeps its own.
  std::optional<std::vector<SkipLink>> skips;
  OptionNames names;
};

// "0:3" -> {0, 3}; UserError naming --skip for anything else.
SkipLink parse_skip(const std::string& text);

// A schedule ready to simulate or run.
struct RequestedSchedule {
  // Compute-only (given()), with the REDUCE_GRADs of --dp or of replicated stages, as --export
  // writes it; lowered (*validated) as it runs.
  ValidatedSchedule validated;
  VersionRule rule;  // the weight versions of its stages (asynchronous schedules)
  // avgpipe: the copies combine no gradients, they pull their weights together instead
  // (ScheduleEntry::averages_copies).
  bool averages_copies = false;
  std::optional<IlpReport> ilp;  // what CBC did, for --solver ilp
};

// UserError naming the option (`dp_name`) unless dp >= 1.
void check_data_parallel(int dp, const std::string& dp_name = "--dp");

// "3,1" for {3, 1}, as --replicas is written.
std::string replicas_text(const std::vector<int>& replicas);

// Makes the schedule `request` describes (`cost` gives zb-auto its stage costs; the other
// generators ignore it) and prepares it (below). UserError naming the option for a bad one, or
// the generator's own; a ScheduleError of validation reads "<the schedule> is not valid: ...".
RequestedSchedule make_requested_schedule(const ScheduleRequest& request, const CostModel& cost);

// Resolves a schedule made already: the reductions of `request.dp` copies (none for avgpipe,
// whose copies average weights instead) or the sum over a replicated schedule's replicas, the
// weight rule of `request.schedule` ("" or a file: synchronous) with its family options for
// `request.microbatches` per step (unset: the schedule's), and validation (ScheduleError naming
// rank, position and action, with the grid).
RequestedSchedule prepare_schedule(Schedule schedule, const ScheduleRequest& request);

// `made` with the skip connections of a model, which fall between the stages of a partition
// made once the number of stages is known; validated again. UserError when the schedule (a
// file's) has skip messages of its own between other stages.
RequestedSchedule with_skips(RequestedSchedule made, const std::vector<SkipLink>& skips);

// Simulates under `cost` and refuses a `memory_limit` (0: none) that no schedule of these
// stages can keep or that a rank's peak exceeds (one-line UserError). `record`: with its
// timeline or the figures only (sim/simulator.h).
SimResult simulate_requested(const RequestedSchedule& made, const CostModel& cost,
                             double memory_limit, Record record);

// The title of the simulated timeline (its SVG picture): name, P, V, M, D, bubble and costs.
std::string schedule_timeline_title(const RequestedSchedule& made, const CostModel& cost,
                                    const SimResult& result);

// `pptrain schedule`'s summary as text: the schedule, its weight rule, P, V, M, D, the cost and
// memory settings, makespan and bubble, a line per rank (busy, idle, peak activations, weight
// versions, and peak memory when the cost model counts the weights), and for the ILP what CBC
// proved.
std::string schedule_summary_text(const RequestedSchedule& made, const CostModel& cost,
                                  double memory_limit, const SimResult& result);

// The files `pptrain schedule` writes, each when its path is given.
struct ScheduleFiles {
  std::string csv_path;     // --export: the schedule as CSV (compute-only unless with_comms)
  std::string svg_path;     // --svg: the simulated timeline as a picture
  std::string trace_path;   // --trace: the simulated timeline as a Chrome trace
  bool with_comms = false;  // the CSV with its SEND/RECV, the picture with its messages
};

// Writes `files` (one-line UserError naming the flag of a file it cannot write); the timeline's
// title is schedule_timeline_title()'s.
void write_schedule_files(const RequestedSchedule& made, const CostModel& cost, SimResult& result,
                          const ScheduleFiles& files);

// `--profile FILE`: the costs, in ms, of the profiled model cut into `stages` stages by
// `stage_layers` ("0-3,4-7"; empty: the time partition), for `dp` copies of the pipeline.
// UserError when the ranges do not make `stages` stages.
CostModel profile_stage_costs(const std::string& profile_path, const std::string& stage_layers,
                              int stages, int dp, double mem_w_ratio);

// `pptrain schedule --json`: the schedule, P, V, M, D, makespan, bubble, the memory settings and
// each rank's busy, idle, peak activations, peak memory and weight versions; `solver` and, for
// the ILP, what CBC proved; `skips` ([[from, to], ...]) when the schedule has any.
nlohmann::ordered_json schedule_summary_json(const RequestedSchedule& made, const CostModel& cost,
                                             double memory_limit, const SimResult& result,
                                             ScheduleSolver solver = ScheduleSolver::kHeuristic);

}  // namespace pptrain
