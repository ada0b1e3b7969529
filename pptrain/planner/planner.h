// The joint planner (`pptrain plan`): for a profiled model, P workers and a memory limit in
// bytes, it searches partition x schedule x microbatch count x recomputation with the simulator
// and ranks the candidates that fit by predicted step time.
//
//   Profile profile = read_profile("gpt.json");
//   PlannerOptions options;
//   options.workers = 4;
//   options.memory_limit_bytes = 2e9;
//   options.batch_size = 32;                       // M runs over the divisors of 32
//   PlanSearch search = search_plans(profile, options);
//   const Candidate& best = search.ranked.front();  // UserError from search_plans if none fits
//   Evaluation e = evaluate(profile, options, best); // its schedule and simulated timeline
//
// What is searched:
//   - partitions: uniform, params and time into P x V stages, and pipedream (memory-aware, its
//     own cost model) when it gives P unreplicated stages; equal cuts are simulated once;
//   - schedules: every synchronous registry entry (generators/registry.h) at each chunk count it
//     accepts up to max_chunks; asynchronous ones are left out (their weights are stale, so their
//     step time buys a different training). zb-auto is planned under each rank's own budget in
//     bytes, the planning limit less what that rank holds besides activations (so uneven stages
//     count each their own), and never loses to 1F1B, ZB-H1 or ZB-H2 where they fit
//     (auto_schedule.h); with recomputation it also tries 1F1B's order as fused B's, which the
//     split backward's memory model holds more for (I's rerun makes the weight gradients' share,
//     reserved at F), and keeps the faster of the two within the limit;
//   - microbatch counts M (each microbatch of batch_size / M samples);
//   - recomputation off and on.
// A candidate a generator refuses (interleaved-1f1b with M not a multiple of P, dualpipev with
// M < 2P, more stages than layers) is skipped.
//
// Cost model of a candidate. The profile's figures are for one microbatch of
// profile_microbatch_size samples; a microbatch of b samples scales every time and activation
// byte count by b / profile_microbatch_size (linear: a small microbatch that leaves cores idle
// is predicted too fast). A stage's F, I, W are its layers' sums (sim/cost_model.h:
// cost_from_profile, with the profile's network measurement for transfers, else free transfers
// and 1 GB/s for a replicated stage's all-reduce); a profile with one backward time per layer
// gives w_fraction of it to W. With recomputation a stage keeps only its
// input between F and its backward, and its I (or B) runs the forward again first.
//
// Peak memory of a rank, in bytes: the memory model's (sim/memory_model.h: weights, gradients,
// optimizer state, the step's batch, activations, messages in flight and one action's working
// memory) on the candidate's lowered schedule, with each stage's bytes from the scaled profile:
//   weights          its layers' parameter_bytes; optimizer state optimizer_state_factor x that
//   activation       what one microbatch keeps from F to its backward: its layers' stash_bytes and
//                    its input (the previous layer's activation_bytes), of which I keeps the
//                    layers' measured weight_stash_bytes for W (mem_w_ratio of the stash for a
//                    profile without them); with recomputation the stage input from F to I, and
//                    from I to W the weight gradients' share (which recomputation does not spare)
//   transient        its largest layer's backward_transient_bytes (and forward_transient_bytes
//                    for a forward), and with recomputation its whole stash, the forward made
//                    again in its backward
//   message          the bytes crossing the cut into it (the previous layer's activation_bytes)
//   data             the profile's input_bytes (first stage) and target_bytes (last) per
//                    microbatch, times M
// Fields a profile lacks count 0. Candidates above memory_limit_bytes x (1 - memory_margin) are
// dropped, and in the search not simulated (the model's peaks do not depend on times): the margin
// is for the model's error against a run (within 4% on the matrix of docs/PERFORMANCE.md) and the
// allocator's own slack. The rank is by step time (the simulated makespan, ms), then by peak
// memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/sim/memory_model.h"
#include "pptrain/sim/simulator.h"

namespace pptrain {

struct PlannerOptions {
  int workers = 0;                  // P >= 1: pipeline ranks
  double memory_limit_bytes = 0;    // per rank; 0: no limit
  double memory_margin = 0.05;      // share of the limit the plans leave free, in [0, 1)
  int batch_size = 0;               // samples per step; 0: 4P microbatches of the profile's size
  int profile_microbatch_size = 0;  // samples the profile's figures are for; 0: the profile's
                                    // own (settings.microbatch_size), else 1
  std::vector<int> microbatches;    // M to try; empty: every divisor of batch_size in
  int min_microbatches = 1;         // min_microbatches .. max_microbatches
  int max_microbatches = 1024;
  // Partition methods (partition.h) and schedules (registry names) to try; empty: every method
  // and every synchronous schedule (synchronous_schedules()).
  std::vector<std::string> partitions;
  std::vector<std::string> schedules;
  std::vector<bool> recompute = {false, true};
  int max_chunks = 4;                 // V tried for a schedule that accepts more than one
  double optimizer_state_factor = 2;  // optimizer state per parameter byte (AdamW 2, SGD 1)
  double mem_w_ratio = 0.5;           // r: share of a stage's activations W keeps after I
  // For a profile with one backward time per layer (Profile::splits_backward() false, PipeDream's
  // graph.txt): the share of it W takes, in [0, 1]; I takes the rest. 0, the default, keeps the
  // whole backward in I (every W free), so ZB-H1 times as 1F1B; the zero-bubble paper's T_I = T_W
  // is 0.5. A profile with its own I and W times ignores it.
  double w_fraction = 0;
  int keep = 10;  // candidates kept in PlanSearch::ranked
  // Threads the search runs on (one microbatch count M each at a time); 0: the machine's cores.
  // The result is the same for any number.
  int jobs = 0;
  // Unequal workers (`--workers-profile`, partition/workers.h), [P] each; empty: equal workers,
  // the same plans as without. rank_speeds: each stage's F, I and W take 1/speed as long on the
  // rank that holds it (the slower of its two ranks in a bidirectional schedule), and the `time`
  // cut gives a slower rank fewer layers (with V chunks, stage s taken as on rank s mod P).
  // rank_memory_limits: a rank's own limit in bytes where > 0, else memory_limit_bytes.
  std::vector<double> rank_speeds;
  std::vector<double> rank_memory_limits;
  // D: data-parallel copies of the pipeline (`pptrain plan --dp`), each on P workers of its own;
  // batch_size is then the copies' batch together. rank_speeds and rank_memory_limits are then
  // [D x P], copy d's pipeline rank p at d x P + p. The search plans one copy on batch_size / D
  // samples per step with each pipeline rank at its slowest copy's speed and smallest limit
  // (placement: the identity), so its step times are those of equal shares on the slowest
  // copy's ranks; each ranked candidate then gives the copies their shares of the whole batch
  // for their own paces (Candidate::dp_shares, partition/workers.h: choose_dp_shares).
  int copies = 1;
};

// One point of the search and, once evaluated, its predicted figures.
struct Candidate {
  std::string partition;                 // method(s) that gave the cut, "uniform/time"
  std::vector<LayerRange> stage_layers;  // [P x V] layers of each stage
  std::string schedule;                  // registry name
  int chunks = 1;                        // V
  int microbatches = 1;                  // M
  double microbatch_size = 0;            // samples per microbatch: batch_size / M
  bool recompute = false;
  double step_ms = 0;  // simulated makespan
  double bubble_ratio = 0;
  std::vector<double> peak_bytes;  // [P] peak memory of each rank
  // Whether step_ms and bubble_ratio were simulated: the search does not simulate a candidate
  // above the limit (its step_ms is then infinite).
  bool simulated = false;
  // The schedule the search made for it where making it again would plan it again (zb-auto's,
  // planned for the candidate's costs and limit), which evaluate() then takes as it is; null
  // for the others, and for a candidate made by hand.
  std::shared_ptr<const Schedule> made;
  // Unequal workers: [pipeline rank] = the worker (a rank of the workers profile) that runs it;
  // empty: rank r on worker r. The search tries the orders of the workers (search_plans).
  std::vector<int> placement;
  // PlannerOptions::copies > 1 on unequal workers: each copy's samples per step, when they are
  // not equal (equal shares stay unless these end a step more than 3% sooner).
  std::vector<int> dp_shares;
  double max_peak_bytes() const;
};

struct PlanSearch {
  std::vector<Candidate> ranked;  // the fitting candidates, best first, at most options.keep
  int evaluated = 0;              // candidates whose peaks were predicted
  int simulated = 0;              // of those, simulated (the others are above the limit)
  int fitting = 0;                // of those, within the limit
  Candidate smallest;             // the candidate with the smallest peak (fitting or not)
  int batch_size = 0;             // resolved: samples per step of one copy of the pipeline
  int profile_microbatch_size = 0;
};

// What other shares of the batch must gain on equal ones to be taken: measured speeds of equal
// workers differ by a few percent, which must not move samples.
constexpr double kDpSharesGain = 0.03;
// The data-parallel copies' shares of a step's `batch_size` samples (all copies together) in
// `microbatches` microbatches, for their paces under the cut `stage_layers` (stage s on pipeline
// rank stage_to_rank[s]) on workers of `speeds` ([D x P]: copy d's pipeline rank p at
// d x P + p): a copy's pace is its slowest rank's, the F + I + W of that rank's layers over its
// speed (partition/workers.h: copy_rates, choose_dp_shares).
struct DpShares {
  std::vector<int> shares;  // [copy]; empty when equal shares end a step within kDpSharesGain
  double step = 0;  // the step under the shares taken: the slowest copy's samples x ms / sample
};
DpShares dp_shares_for(const Profile& profile, const std::vector<LayerRange>& stage_layers,
                       const std::vector<int>& stage_to_rank, const std::vector<double>& speeds,
                       int batch_size, int microbatches);

// A candidate's schedule (compute only, as `--schedule-file` reads it) and its simulation.
struct Evaluation {
  Schedule schedule;
  CostModel cost;  // the candidate's, under which `sim` was simulated
  SimResult sim;
  std::vector<RankMemory> memory;  // [P] the memory model's parts of each rank
  std::vector<double> peak_bytes;  // [P] their totals
};

// Checks the options (UserError naming the option for P < 1, a negative limit, an M that does
// not divide the batch, an unknown partition method or schedule, an asynchronous schedule).
void check_planner_options(const PlannerOptions& options);

// The whole search. UserError if no candidate applies, or none fits the limit (the message
// names the smallest peak any candidate needs). With unequal workers (rank_speeds or
// rank_memory_limits), the search runs once for every order of the workers that differs in what
// the pipeline ranks get (speed and limit; the identity first, at most kMaxPlacements of them),
// each candidate carrying its placement, and ranks them all together: the placement is chosen
// with everything else. When no order fits, the identity's error.
PlanSearch search_plans(const Profile& profile, const PlannerOptions& options);

// The orders the planner tries (5!: every order of 5 unequal workers).
constexpr int kMaxPlacements = 120;
// The distinct placements of workers with these speeds and limits ([worker], either empty), the
// identity first, then in lexicographic order, at most kMaxPlacements.
std::vector<std::vector<int>> distinct_placements(int workers, const std::vector<double>& speeds,
                                                  const std::vector<double>& limits);
// The options as the pipeline ranks see them under `placement` ([rank] = worker): rank r takes
// worker placement[r]'s speed and memory limit. Empty placement: the options as they are.
PlannerOptions placed_options(const PlannerOptions& options, const std::vector<int>& placement);

// With copies > 1, the options the search plans one copy with (PlannerOptions::copies): the
// batch's 1/D, each pipeline rank at its slowest copy's speed and smallest limit ([P]); UserError
// for a batch that is not a multiple of D. One copy: the options as they are.
PlannerOptions one_copy(const PlannerOptions& options);

// `pptrain plan`'s table: the profile, the workers and the limit, how the backward is split, the
// search's counts and its time in `seconds`, then one line per ranked candidate.
std::string plan_table_text(const Profile& profile, const PlannerOptions& options,
                            const PlanSearch& search, double seconds);

// Evaluates one candidate (schedule, partition, chunks, M, recompute set): its schedule,
// simulation and per-rank peaks; fills the candidate's predicted figures. A candidate with the
// schedule the search made for it (Candidate::made) is evaluated on that schedule. UserError if
// the generator refuses it (the search skips those).
Evaluation evaluate(const Profile& profile, const PlannerOptions& options, Candidate& candidate);

// The memory model's peak bytes of every rank ([P]) for each of `cuts`, the candidate `shape`
// (schedule, V, M, recomputation; its stage_layers ignored) cut each way: what evaluate() gives
// as peak_bytes, without simulating, the schedule made and walked once (zb-auto, whose schedule
// depends on the cut, is planned for each). `gradient_buffers`: the ranks also hold the flat
// buffer copies of their gradients that an all-reduce over data-parallel copies adds.
std::vector<std::vector<double>> cut_peak_bytes(const Profile& profile,
                                                const PlannerOptions& options,
                                                const Candidate& shape,
                                                const std::vector<std::vector<LayerRange>>& cuts,
                                                bool gradient_buffers = false);

// Rank r's memory limit in bytes: its own (rank_memory_limits) where > 0, else the common one;
// 0: none. Plans are made under it less memory_margin.
double rank_memory_limit(const PlannerOptions& options, int rank);
// Whether every rank's peak ([P] bytes) is within its limit less the margin.
bool fits_memory_limits(const PlannerOptions& options, const std::vector<double>& peak_bytes);
// "1234.5 MB".
std::string megabytes(double bytes);

// `--optimizer`: the optimizer state per parameter byte of "adamw" (2) or "sgd" (1, with its
// default momentum: state_bytes_per_parameter_byte()); UserError naming the flag otherwise.
double optimizer_state_factor(const std::string& optimizer);
// `--recompute`: "both" {false, true}, "on" {true}, "off" {false}; UserError otherwise.
std::vector<bool> recompute_choices(const std::string& recompute);
// `--w-fraction` given for a profile with its own I and W times (which it would not change):
// UserError naming the value and the profile.
void check_w_fraction_applies(const Profile& profile, double w_fraction);

// The registry's synchronous schedules (the planner's default list), in registry order.
std::vector<std::string> synchronous_schedules();

}  // namespace pptrain
