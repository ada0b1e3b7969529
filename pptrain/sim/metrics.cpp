#include "pptrain/sim/metrics.h"

#include <algorithm>
#include <limits>

#include "pptrain/common/check.h"

namespace pptrain {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TimelineTally::TimelineTally(int num_ranks)
    : ranks_(num_ranks),
      first_(num_ranks, kInf),
      last_(num_ranks, -kInf),
      busy_(num_ranks, 0.0),
      earliest_(kInf),
      latest_(-kInf) {
  PPTRAIN_ASSERT(num_ranks > 0, "timeline without ranks");
}

TimelineStats TimelineTally::stats() const {
  TimelineStats stats;
  stats.busy = busy_;
  if (empty_) return stats;
  double total_busy = 0;
  for (int r = 0; r < ranks_; ++r) {
    if (first_[r] < kInf) stats.cost = std::max(stats.cost, last_[r] - first_[r]);
    total_busy += stats.busy[r];
  }
  stats.makespan = latest_ - earliest_;
  stats.bubble_ratio = stats.cost > 0 ? 1.0 - total_busy / (ranks_ * stats.cost) : 0.0;
  for (int r = 0; r < ranks_; ++r) stats.idle.push_back(stats.makespan - stats.busy[r]);
  return stats;
}

TimelineStats timeline_stats(const Timeline& timeline) {
  TimelineTally tally(timeline.num_ranks);
  for (const auto& e : timeline.events) tally.add(e.rank, e.action.op, e.start, e.end);
  return tally.stats();
}

}  // namespace pptrain
