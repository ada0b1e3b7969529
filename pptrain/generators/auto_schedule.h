// zb-auto: a zero-bubble schedule composed for given per-stage costs under a memory limit, by the
// greedy heuristic of the zero-bubble paper (Qi et al., arXiv 2401.10241, section 3.1).
//
//   StageCosts c = StageCosts::uniform(/*stages=*/4);           // F = I = W = 1, comm 0
//   Schedule s = make_zb_auto({/*ranks=*/4, /*microbatches=*/8, c, /*memory_limit=*/4});
//   // by name: make_schedule({"zb-auto", 4, 8}) with ScheduleOptions::costs / memory_limit
//
// Memory model (sim/cost_model.h says the same): memory is counted in units of one microbatch's
// forward activations on one stage. F adds `activation[s]` (1 by default); I frees all of it but
// `weight_stash[s]` (r = M_W / M_B of it, 0.5 by default), which W frees. The limit caps every
// rank's running sum, which is the simulator's `peak_activations`: a limit of P is the paper's
// ZB-1p (1F1B's memory), 2P its ZB-2p. Any limit >= the largest `activation[s]` works (every
// rank can run F, I, W one microbatch at a time); below that no schedule exists.
//
// The greedy places the actions of every rank in rounds, tracking when each would start and end
// under the simulator's rules (a rank runs its list in order; F waits for the previous stage's F
// plus `comm`, I for its own F and the next stage's I plus `comm`, W for its own I):
//   1. Warm-up. Every stage runs microbatch 0's F. Then, from the last stage back, each stage gets
//      as many further F's as fit (in time and in memory) before the input gradient of
//      microbatch 0 can reach it; a stage runs fewer warm-up F's than the one before it (as in
//      1F1B; equal counts only where M < P or the limit leaves no room).
//      Then microbatch 0's I runs from the last stage back to the first.
//   2. Round i = 1 .. M-1: every stage runs one more F (keeping its warm-up count in flight),
//      first stage first, then microbatch i's I from the last stage back. Before each F and I,
//      pending W's fill the wait for its input when they fit in it (a gap at least T_W long); a W
//      also runs when the memory the next F needs is not free (W releases its stash).
//   3. The W's left run at the end.
// Three choices are made both ways, and the warm-up three ways, and the best of the 24 resulting
// schedules and of the fixed orders below is kept (the smallest longest rank span, which is the
// simulator's `cost`):
//   - bubble_before_first_i: a warm-up F may still start when it would end after the first
//     gradient arrives (delaying that I a little), or only when it ends in time;
//   - prioritize_i: a stage already two F's ahead of the next one runs its round's F only where
//     it fits before the I's input arrives, else after the I;
//   - fill_small_gaps: a W runs in a gap shorter than T_W always, or only when idling there would
//     make this rank the one with the most idle time so far;
//   - warm-up shape: stage j runs as many warm-up F's as fit, or at most 1F1B's P - j, or at most
//     ZB-H2's 2(P - j) - 1; fewer F's in flight leave memory for W's held back to fill gaps.
//   - fixed orders (generators.h), where every rank's peak fits its limit: 1F1B's with each W
//     right after its I (1F1B's memory: under a budget where 1F1B fits, zb-auto is never slower,
//     the paper's ZB-1p argument), ZB-H1's and ZB-H2's. The greedy, under a tight budget, may
//     serialise the pipeline where these keep it full.
// Each rank may have its own limit (AutoScheduleOptions::rank_memory_limits): the planner gives
// each the bytes left beside that rank's own weights and optimizer state, and uneven stages
// each their own activations.
// Each candidate takes O(P M) steps, so P = 32, M = 256 plans in tens of milliseconds
// (bench/plan_bench.cpp). The warm-up choices often give the same warm-up F counts (under a
// limit, or when the gradient comes back before any cap): a candidate whose counts and round
// choices (prioritize_i, fill_small_gaps) repeat an earlier one's would make its schedule
// again, and stops after its warm-up.
#pragma once

#include <optional>
#include <vector>

#include "pptrain/schedule/schedule.h"

namespace pptrain {

// Per-stage costs of one microbatch, for planning. The units of time are free (shared with
// comm); memory is in memory-model units (see above). Filled from a CostModel by
// CostModel::stage_costs() (sim/cost_model.h).
struct StageCosts {
  std::vector<double> forward;          // [stage] F time
  std::vector<double> backward_input;   // [stage] I time
  std::vector<double> backward_weight;  // [stage] W time
  std::vector<double> activation;       // [stage] memory F adds
  std::vector<double> weight_stash;     // [stage] memory held from I to W (<= activation)
  double comm = 0;                      // latency of a transfer between ranks

  // Every stage F, I, W and activation 1, stash r.
  static StageCosts uniform(int stages, double forward = 1, double backward_input = 1,
                            double backward_weight = 1, double comm = 0, double mem_w_ratio = 0.5);
  int stages() const { return static_cast<int>(forward.size()); }
};

struct AutoScheduleOptions {
  int ranks = 1;            // P >= 1 (one stage per rank)
  int microbatches = 1;     // M >= 1
  StageCosts costs = {};    // [P] stages; empty: StageCosts::uniform(P)
  double memory_limit = 0;  // cap on every rank's peak, memory-model units; 0: no limit
  // Optional: [P] cap on each rank's peak, memory-model units (the planner's are bytes), 0 for
  // none on that rank; when non-empty it replaces memory_limit.
  std::vector<double> rank_memory_limits = {};
  // Skip a greedy candidate whose warm-up repeats an earlier one's (it would make the same
  // schedule), and stop one once its makespan is sure to be above the best so far's (it would
  // not be kept); false runs every one to the end, which tests compare with.
  bool prune_candidates = true;
};

// The smallest memory limit any schedule of these stages can keep: the largest activation.
double smallest_memory_limit(const StageCosts& costs);
// UserError (one line, giving the smallest limit that works) when `limit` is negative, not
// finite, or above 0 and below smallest_memory_limit(); 0 means no limit.
void check_feasible_memory_limit(const StageCosts& costs, double limit);
// The same for a limit per rank (stage r on rank r): UserError naming the first rank whose limit
// is below its stage's activation (one microbatch) and that smallest limit; 0 entries: none.
void check_feasible_memory_limits(const StageCosts& costs, const std::vector<double>& limits);

// Each rank's cap [P]: rank_memory_limits if given, else memory_limit on every rank; 0: none.
std::vector<double> resolved_memory_limits(const AutoScheduleOptions& options);
// Whether every rank's peak_in_order count stays within its cap (0: none), with a slack of
// 1e-9 of the cap for sums of bytes in another order.
bool within_limits(const Schedule& schedule, const StageCosts& costs,
                   const std::vector<double>& limits);

// The most memory each rank [rank] of a compute-only schedule of these stages holds, counting its
// actions in order (F +activation, I -(activation - stash), W -stash). A rank runs one action at
// a time, so this is the simulator's timed peak_activations too. peak_in_order: their largest.
std::vector<double> peaks_in_order(const Schedule& schedule, const StageCosts& costs);
double peak_in_order(const Schedule& schedule, const StageCosts& costs);

// How long a compute-only schedule with one stage per rank takes, timed by the simulator's rules
// (a rank runs its list in order, each action once its inputs have arrived; a transfer between
// ranks takes costs.comm), in the costs' unit of time.
struct ScheduleTiming {
  double span = 0;      // longest rank span, first start to last end: simulate()'s `cost`
  double makespan = 0;  // end of the last action, the first starting at 0: simulate()'s makespan
};
// Nothing when the lists deadlock.
std::optional<ScheduleTiming> timed_in_order(const Schedule& schedule, const StageCosts& costs);

// The best of the greedy's candidates and of the fixed orders that fit. UserError naming the
// value for P < 1, M < 1, costs for another number of stages, a negative or non-finite cost, or
// a limit below what one microbatch needs (the message gives the rank and that smallest limit).
// `predicted_cost`, when given, receives the longest rank span the greedy timed for the chosen
// schedule: what simulate() reports as `cost` for it under the same costs.
Schedule make_zb_auto(const AutoScheduleOptions& options, double* predicted_cost = nullptr);

}  // namespace pptrain
