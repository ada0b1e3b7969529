// Figures read off a Timeline, with one definition for predicted (simulated) and measured runs.
//
//   busy[r]      = sum of the durations of rank r's compute events (F, I, W, B, OVERLAP_F_B)
//   span[r]      = end of r's last event - start of r's first event
//   cost         = max over ranks of span[r]
//   bubble_ratio = 1 - sum(busy) / (P * cost)     (P = timeline.num_ranks)
//   makespan     = latest end - earliest start over all events
//   idle[r]      = makespan - busy[r]
// With equal stages this is the zero-bubble paper's (cost - M(T_F+T_B+T_W)) / cost.
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

}  // namespace pptrain
