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

#include <algorithm>
#include <vector>

#include "pptrain/common/check.h"
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
  // Inline: a simulation adds every action of a schedule.
  void add(int rank, Op op, double start, double end) {
    PPTRAIN_ASSERT(rank >= 0 && rank < ranks_, "event on rank ", rank);
    empty_ = false;
    first_[rank] = std::min(first_[rank], start);
    last_[rank] = std::max(last_[rank], end);
    earliest_ = std::min(earliest_, start);
    latest_ = std::max(latest_, end);
    if (is_compute(op)) busy_[rank] += end - start;
  }
  TimelineStats stats() const;

 private:
  int ranks_;
  bool empty_ = true;
  std::vector<double> first_, last_, busy_;  // [rank]
  double earliest_, latest_;
};

}  // namespace pptrain
