// Figures read off a Timeline, with one definition for predicted (simulated) and measured runs.
//
//   busy[r]      = sum of the durations of rank r's compute events (F, I, W, B, OVERLAP_F_B)
//   span[r]      = end of r's last event - start of r's first event (any kind: a REDUCE_GRAD
//                  that ends after the rank's compute extends it)
//   cost         = max over ranks of span[r]
//   bubble_ratio = 1 - sum(busy) / (P * cost)     (P = timeline.num_ranks)
//   makespan     = latest end - earliest start over all events
//   idle[r]      = makespan - busy[r]
// With equal stages this is the zero-bubble paper's (cost - M(T_F+T_B+T_W)) / cost. Only compute
// is busy: a REDUCE_GRAD (data-parallel all-reduce, on its own channel) counts neither as busy
// nor twice, so while it runs under compute that time is busy once, and where it runs after the
// rank's last compute that time is idle (the rank waits for it before the optimizer step) and
// adds to the bubble.

#pragma once

#include <vector>

#include "pptrain/schedule/timeline.h"

namespace pptrain {

struct TimelineStats {
  double makespan = 0;
  double cost = 0;
  double bubble_ratio = 0;
  std::vector<double> busy;  // [num_ranks]
  std::vector<double> idle;  // [num_ranks]
};

TimelineStats timeline_stats(const Timeline& timeline);

// The same figures gathered one event at a time, for whoever makes the events and need not keep
// them (a simulation asked for its figures only). Events may come in any order; a rank's busy
// time is summed in the order they come, so the same events in the same order give
// timeline_stats()'s figures bit for bit.
//
//   TimelineTally tally(P);
//   tally.add(rank, action.op, start, end);  ...
//   TimelineStats stats = tally.stats();
class TimelineTally {
 public:
  explicit TimelineTally(int num_ranks);
  void add(int rank, Op op, double start, double end);
  TimelineStats stats() const;

 private:
  int ranks_;
  bool empty_ = true;
  std::vector<double> first_, last_, busy_;  // [rank]
  double earliest_, latest_;
};

}  // namespace pptrain
