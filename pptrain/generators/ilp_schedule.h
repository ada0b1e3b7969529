// zb-auto solved exactly: the zero-bubble paper's integer program (Qi et al., arXiv 2401.10241,
// appendix G) over every rank's order of F, I, W, solved by COIN-OR CBC within a time limit and
// warm-started from zb-auto's heuristic schedule (auto_schedule.h: the best of the greedy's and
// of the fixed orders that fit, so 1F1B's where nothing beats it). `--solver ilp` of pptrain
// schedule. Each rank may have its own memory limit (AutoScheduleOptions::rank_memory_limits).
//
//   IlpReport report;
//   Schedule s = make_zb_ilp({/*ranks=*/4, /*microbatches=*/8, costs, /*limit=*/4}, 30, &report);
//   // report.proven_optimal, report.objective, report.best_bound, report.gap, report.solve_s
//
// The program, one stage per rank (P stages, M microbatches):
//   - a continuous end time E(x) for every action x = (op, stage, microbatch);
//   - chains: F(s, j) >= F(s-1, j) + comm + T_F, I(s, j) >= I(s+1, j) + comm + T_I, and on a stage
//     F(j) after F(j-1), I(j) after F(j) and I(j-1), W(j) after I(j) and W(j-1);
//   - one binary O(x, y) per pair of a stage's actions whose order those chains leave open (F(a)
//     and I(b), I(a) and W(b), F(a) and W(b) with a > b; every other same-stage pair is ordered by
//     the chains, through other stages too), O(y, x) read as 1 - O(x, y); big-M disjunction:
//     E(y) >= E(x) + T(y) when O(x, y) = 1, E(x) >= E(y) + T(x) otherwise;
//   - memory: after each F(b), the stage's activations of F(0..b) minus what the I's and W's
//     ordered before F(b) freed stay within the limit (the peak is always right after an F);
//   - objective: the longest stage span, from its first F's start to its last W's end.
// Two choices make it the simulator's objective and speed it up. A stage's first F starts when
// its input arrives, as the simulator runs it (appendix G lets a stage start late to shorten its
// span, which no runtime does); so the optimum is the best `cost` simulate() can report over all
// valid orders. And no action may end after its stage's start plus the greedy's span less the
// work the chains put after it: that cuts nothing better than the warm start, and with each
// action's earliest end it gives every big-M row its own small M (the most the row can be off
// by within those bounds). The span also gets a floor: its stage's work, and the wait for its
// first gradient plus all its I's and W's.
//
// The result is never worse than the greedy: the ILP's order is re-timed with the simulator's
// rules, and the greedy's schedule is returned unless that order is shorter.
// PPTRAIN_CBC_LOG=1 in the environment prints CBC's own log on stdout (for debugging a slow solve).
#pragma once

#include "pptrain/generators/auto_schedule.h"
#include "pptrain/schedule/schedule.h"

namespace pptrain {

// What the solver did. Times in the costs' unit; the objective is the longest rank span, the
// simulator's `cost`.
struct IlpReport {
  bool proven_optimal = false;  // CBC closed the gap: no order of these actions is shorter
  double objective = 0;         // span of the returned schedule (re-timed)
  double heuristic = 0;         // span of the greedy's schedule, the warm start
  double best_bound = 0;        // CBC's lower bound on any order's span
  double gap = 0;               // (objective - best_bound) / objective; 0 when proven optimal
  double solve_s = 0;           // wall time spent building and solving the program, seconds
  bool improved = false;        // the ILP's order beat the greedy (else the greedy's is returned)
  int binaries = 0;             // order variables O(x, y) of the program
};

// The most order variables make_zb_ilp() accepts: beyond, CBC would need minutes to build the
// program and hours to solve it (P = 4, M = 8 has 336).
constexpr int kMaxIlpBinaries = 20000;

// The zb-auto schedule for `options` found by CBC within `time_limit_s` seconds (> 0); `report`,
// when given, receives what it did. UserError as make_zb_auto() for bad options, and naming
// the value for a time limit that is not a finite number > 0 or a program beyond
// kMaxIlpBinaries.
Schedule make_zb_ilp(const AutoScheduleOptions& options, double time_limit_s,
                     IlpReport* report = nullptr);

}  // namespace pptrain
