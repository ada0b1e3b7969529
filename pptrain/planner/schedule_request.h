// One schedule as `pptrain schedule` makes, checks and simulates it, for the CLI and the Python
// package (python/, `pptrain.plan.schedule()`), so that both take the same options with the same
// errors and print the same figures.
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
// An imported schedule (a CSV file) skips make_requested_schedule(): prepare_schedule() gives
// it the same reductions, weight rule and validation.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/schedule/ilp_schedule.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"

namespace pptrain {

// PipeDream's round robin is not a registry entry (its shape comes from a partition): a request
// makes it from `replicas`.
constexpr const char* kRoundRobinSchedule = "1f1b-rr";

// The options of `pptrain schedule --schedule NAME`; the error messages name those flags.
struct ScheduleRequest {
  std::string schedule;             // a registry name, or kRoundRobinSchedule with `replicas`
  std::optional<int> pp;            // P: required, except for 1f1b-rr (the sum of its replicas)
  std::optional<int> microbatches;  // M per mini-batch: required
  int chunks = 0;                   // V: stages per rank; 0: the schedule's default
  std::vector<int> replicas;        // 1f1b-rr only: replicas of each stage, {3, 1}
  int steps = 3;                    // an asynchronous schedule: mini-batches in one run, no flush
  bool vertical_sync = false;       // pipedream's vertical sync
  int dp = 1;                       // D: data-parallel copies; > 1 adds REDUCE_GRADs
  // Cap on every rank's peak activations (memory-model units); zb-auto plans under it, any
  // schedule above it is refused after simulation. 0: none.
  double memory_limit = 0;
  ScheduleSolver solver = ScheduleSolver::kHeuristic;  // zb-auto only
  double time_limit_s = 60;                            // kIlp: CBC's wall-time limit, seconds
  // --skip FROM:TO: skip connections between stages (Schedule::skips), in any order; lowering
  // adds their messages. ScheduleError (one line) for a skip that does not pass a stage.
  std::vector<SkipLink> skips;
};

// "0:3" -> {0, 3}; UserError naming --skip for anything else.
SkipLink parse_skip(const std::string& text);

// A schedule ready to simulate or run.
struct RequestedSchedule {
  // Compute-only (given()), with the REDUCE_GRADs of --dp or of replicated stages, as --export
  // writes it; lowered (*validated) as it runs.
  ValidatedSchedule validated;
  VersionRule rule;              // the weight versions of its stages (asynchronous schedules)
  std::optional<IlpReport> ilp;  // what CBC did, for --solver ilp
};

// UserError naming --dp unless dp >= 1.
void check_data_parallel(int dp);

// "3,1" for {3, 1}, as --replicas is written.
std::string replicas_text(const std::vector<int>& replicas);

// Generates, adds the reductions, validates. `cost` gives zb-auto its stage costs (the other
// generators ignore it). UserError naming the flag for a bad option, or the generator's own.
RequestedSchedule make_requested_schedule(const ScheduleRequest& request, const CostModel& cost);

// The reductions of --dp D (none for avgpipe, `averages_copies`, whose copies average weights
// instead), the sum over a replicated schedule's replicas, the weight rule of `rule_name` (a
// registry name, "" for a file: synchronous) for `microbatches_per_step`, and validation
// (ScheduleError naming rank, position and action, with the grid).
RequestedSchedule prepare_schedule(Schedule schedule, const std::string& rule_name,
                                   bool vertical_sync, int microbatches_per_step, int dp,
                                   bool averages_copies = false);

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

// `--import FILE.csv`: the schedule of a CSV file, named after the file ("dir/1f1b.csv" ->
// "1f1b"). UserError (one line naming the flag) when a given --pp, --microbatches or --chunks
// does not match what the file holds.
Schedule import_schedule(const std::string& path, std::optional<int> pp,
                         std::optional<int> microbatches, std::optional<int> chunks);

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
