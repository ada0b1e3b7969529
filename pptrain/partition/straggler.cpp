#include "pptrain/partition/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/stats.h"
#include "pptrain/partition/workers.h"

namespace pptrain {

StragglerWatch::StragglerWatch(Profile profile, int microbatches, std::vector<LayerRange> ranges,
                               std::vector<double> speeds, Cutter cut, StragglerOptions options)
    : profile_(std::move(profile)),
      microbatches_(microbatches),
      ranges_(std::move(ranges)),
      speeds_(std::move(speeds)),
      cut_(std::move(cut)),
      options_(options) {
  const size_t ranks = ranges_.size();
  if (speeds_.empty()) speeds_.assign(ranks, 1.0);
  PPTRAIN_ASSERT(speeds_.size() == ranks && microbatches_ >= 1 && cut_ && options_.steps >= 1 &&
                 options_.baseline_steps >= 1 && options_.threshold > 1);
  for (const auto& [first, last] : ranges_) {
    double ms = 0;
    for (int l = first; l <= last; ++l) ms += profile_.layers[l].compute_ms();
    work_s_.push_back(std::max(ms, 1e-9) * microbatches_ / 1000);
  }
  baseline_paces_.assign(ranks, {});
  recent_.assign(ranks, {});
}

std::optional<Replan> StragglerWatch::observe(const std::vector<double>& compute_s) {
  const int ranks = static_cast<int>(ranges_.size());
  PPTRAIN_ASSERT(static_cast<int>(compute_s.size()) == ranks);
  ++seen_;
  if (seen_ <= options_.settle_steps) return std::nullopt;
  const int baseline_end = options_.settle_steps + options_.baseline_steps;
  std::vector<double> pace(ranks);
  for (int r = 0; r < ranks; ++r) pace[r] = compute_s[r] / work_s_[r];
  if (seen_ <= baseline_end) {
    for (int r = 0; r < ranks; ++r) baseline_paces_[r].push_back(pace[r]);
    if (seen_ == baseline_end) {
      for (int r = 0; r < ranks; ++r) baseline_.push_back(median(baseline_paces_[r]));
    }
    return std::nullopt;
  }
  bool outside = false;
  for (int r = 0; r < ranks; ++r) {
    std::vector<double>& recent = recent_[r];
    recent.push_back(pace[r]);
    if (static_cast<int>(recent.size()) > options_.steps) recent.erase(recent.begin());
    const double ratio = pace[r] / baseline_[r];
    outside = outside || ratio > options_.threshold || ratio < 1 / options_.threshold;
  }
  outside_ = outside ? outside_ + 1 : 0;
  if (outside_ < options_.steps) return std::nullopt;

  // Each rank's speed now: the speed the cut was made for, times how its pace changed (the
  // median of the last steps, so one slow step does not decide).
  Replan replan;
  double furthest = 0;
  for (int r = 0; r < ranks; ++r) {
    const double change = median(recent_[r]) / baseline_[r];
    replan.speeds.push_back(speeds_[r] / change);
    if (std::abs(std::log(change)) > furthest) {
      furthest = std::abs(std::log(change));
      replan.rank = r;
      replan.slowdown = change;
    }
  }
  const double fastest = *std::max_element(replan.speeds.begin(), replan.speeds.end());
  for (double& s : replan.speeds) s /= fastest;
  for (int r = 0; r < ranks; ++r) {
    replan.before_s = std::max(replan.before_s, work_s_[r] / replan.speeds[r]);
  }
  outside_ = 0;  // the band is left: decide again only after `steps` more steps
  cut_(replan);
  if (!replan.kept.empty()) {
    // The cut stays: the paces now are what it runs at, and the speeds they stand for.
    speeds_ = replan.speeds;
    for (int r = 0; r < ranks; ++r) baseline_[r] = median(recent_[r]);
    return replan;
  }
  if ((replan.ranges == ranges_ && replan.placement.empty()) ||
      replan.after_s > (1 - options_.min_gain) * replan.before_s) {
    return std::nullopt;
  }
  return replan;
}

std::string describe_replan(const Replan& replan, const std::vector<LayerRange>& before) {
  char text[256];
  std::snprintf(text, sizeof text, "rank %d computes %.2fx its pace at the cut; stage layers %s",
                replan.rank, replan.slowdown, format_stage_layers(before).c_str());
  if (!replan.kept.empty()) return text + std::string(" stay: ") + replan.kept;
  std::string out = text + std::string(" -> ") + format_stage_layers(replan.ranges);
  if (!replan.placement.empty()) out += ", placement " + format_placement(replan.placement);
  std::snprintf(text, sizeof text, " (slowest stage %.3f s -> %.3f s per step, predicted)",
                replan.before_s, replan.after_s);
  return out + text;
}

}  // namespace pptrain
