#include "pptrain/sim/metrics.h"

#include <algorithm>
#include <limits>

#include "pptrain/common/check.h"

namespace pptrain {

TimelineStats timeline_stats(const Timeline& timeline) {
  const int ranks = timeline.num_ranks;
  PPTRAIN_ASSERT(ranks > 0, "timeline without ranks");
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> first(ranks, kInf), last(ranks, -kInf);
  TimelineStats stats;
  stats.busy.assign(ranks, 0.0);
  double earliest = kInf, latest = -kInf;
  for (const auto& e : timeline.events) {
    PPTRAIN_ASSERT(e.rank >= 0 && e.rank < ranks, "event on rank ", e.rank);
    first[e.rank] = std::min(first[e.rank], e.start);
    last[e.rank] = std::max(last[e.rank], e.end);
    earliest = std::min(earliest, e.start);
    latest = std::max(latest, e.end);
    if (is_compute(e.action.op)) stats.busy[e.rank] += e.end - e.start;
  }
  if (timeline.events.empty()) return stats;
  double total_busy = 0;
  for (int r = 0; r < ranks; ++r) {
    if (first[r] < kInf) stats.cost = std::max(stats.cost, last[r] - first[r]);
    total_busy += stats.busy[r];
  }
  stats.makespan = latest - earliest;
  stats.bubble_ratio = stats.cost > 0 ? 1.0 - total_busy / (ranks * stats.cost) : 0.0;
  for (int r = 0; r < ranks; ++r) stats.idle.push_back(stats.makespan - stats.busy[r]);
  return stats;
}

}  // namespace pptrain
