#include "pptrain/schedule/weight_versions.h"

#include <algorithm>
#include <cmath>

#include "pptrain/common/check.h"

namespace pptrain {

const char* update_name(WeightUpdate update) {
  switch (update) {
    case WeightUpdate::kFlush:
      return "flush";
    case WeightUpdate::kPipeDream:
      return "pipedream";
    case WeightUpdate::kVerticalSync:
      return "vertical-sync";
    case WeightUpdate::kTwoBW:
      return "2bw";
    case WeightUpdate::kPipeMare:
      return "pipemare";
    case WeightUpdate::kAmpNet:
      return "ampnet";
    case WeightUpdate::kSpecTrain:
      return "spectrain";
    case WeightUpdate::kXPipe:
      return "xpipe";
    case WeightUpdate::kWPipe:
      return "wpipe";
  }
  return "?";
}

int VersionRule::period() const {
  switch (update) {
    case WeightUpdate::kPipeDream:
    case WeightUpdate::kVerticalSync:
    case WeightUpdate::kSpecTrain:
      return 1;
    case WeightUpdate::kAmpNet:
      return update_interval;
    case WeightUpdate::kFlush:
    case WeightUpdate::kTwoBW:
    case WeightUpdate::kPipeMare:
    case WeightUpdate::kXPipe:
    case WeightUpdate::kWPipe:
      return microbatches_per_step;
  }
  return 1;
}

namespace {

// round(x) with ties to the even neighbour, as the papers' Python round() does.
int round_half_even(double x) {
  const double down = std::floor(x);
  const double rest = x - down;
  if (rest > 0.5) return static_cast<int>(down) + 1;
  if (rest < 0.5) return static_cast<int>(down);
  const int even = static_cast<int>(down);
  return even % 2 == 0 ? even : even + 1;
}

}  // namespace

int VersionRule::prediction_lag(int stage, bool backward) const {
  PPTRAIN_ASSERT(stage >= 0 && stage < stages);
  const int half = stage / 2;
  switch (update) {
    case WeightUpdate::kSpecTrain:
      return backward ? half : half + stages - 1 - stage;
    case WeightUpdate::kXPipe: {
      const double m = microbatches_per_step;
      return backward ? round_half_even((m - 1 + half) / m)
                      : round_half_even((stages + m - stage / 2.0 - 2) / m);
    }
    default:
      return 0;
  }
}

int VersionRule::forward_version(int i, int stage) const {
  PPTRAIN_ASSERT(i >= 0 && stage >= 0 && stage < stages && microbatches_per_step >= 1);
  switch (update) {
    case WeightUpdate::kFlush:
      return i / microbatches_per_step;
    case WeightUpdate::kPipeDream:
      return std::max(0, i - (stages - 1 - stage));
    case WeightUpdate::kVerticalSync:
      return std::max(0, i - (stages - 1));
    case WeightUpdate::kTwoBW:
      return std::max(0, i / microbatches_per_step - 1);
    case WeightUpdate::kWPipe:
      return in_first_group(stage) ? std::max(0, i / microbatches_per_step - 1)
                                   : i / microbatches_per_step;
    case WeightUpdate::kPipeMare:
    case WeightUpdate::kAmpNet:
    case WeightUpdate::kSpecTrain:
    case WeightUpdate::kXPipe: {
      // Stage s runs S-1-s forwards ahead, so i's forward comes after the backwards of
      // microbatches 0 .. i-(S-s)-1, and a step follows every period()-th backward. A
      // prediction group starts from the version of its first microbatch.
      const int first = i - i % prediction_group();
      return std::max(0, first - (stages - 1 - stage)) / period();
    }
  }
  return 0;
}

int VersionRule::backward_version(int i, int stage) const {
  switch (update) {
    case WeightUpdate::kPipeMare:
    case WeightUpdate::kAmpNet:
    case WeightUpdate::kSpecTrain:
    case WeightUpdate::kXPipe:
      PPTRAIN_ASSERT(i >= 0 && stage >= 0 && stage < stages && period() >= 1);
      return (i - i % prediction_group()) / period();  // after the backwards of 0 .. i-1
    default:
      return forward_version(i, stage);
  }
}

int VersionRule::delay(int stage) const {
  if (update != WeightUpdate::kPipeMare && update != WeightUpdate::kAmpNet) return 0;
  return (stages - 1 - stage + period() - 1) / period();
}

bool VersionRule::steps_after(int i) const {
  switch (update) {
    case WeightUpdate::kPipeDream:
    case WeightUpdate::kVerticalSync:
      return true;
    case WeightUpdate::kFlush:
    case WeightUpdate::kTwoBW:
    case WeightUpdate::kPipeMare:
    case WeightUpdate::kAmpNet:
    case WeightUpdate::kSpecTrain:
    case WeightUpdate::kXPipe:
    case WeightUpdate::kWPipe:
      return (i + 1) % period() == 0;
  }
  return false;
}

int VersionRule::oldest_needed_after(int i, int stage) const {
  // Versions never decrease with i, and every later action is of a microbatch > i, or the
  // forward of one not yet run (also > i in the 1F1B and one-process orders).
  return std::min(forward_version(i + 1, stage), backward_version(i + 1, stage));
}

int VersionRule::versions_kept(int stage) const {
  switch (update) {
    case WeightUpdate::kFlush:
    case WeightUpdate::kPipeMare:
    case WeightUpdate::kAmpNet:
      return 1;
    case WeightUpdate::kSpecTrain:  // one predicted copy serves both passes, one at a time
      return prediction_lag(stage, false) > 0 || prediction_lag(stage, true) > 0 ? 2 : 1;
    case WeightUpdate::kXPipe:  // the mini-batch's forward and backward predictions, side by side
      return 1 + (prediction_lag(stage, false) > 0 ? 1 : 0) +
             (prediction_lag(stage, true) > 0 ? 1 : 0);
    case WeightUpdate::kPipeDream:
      return stages - stage;
    case WeightUpdate::kVerticalSync:
      return stages;
    case WeightUpdate::kTwoBW:
      return 2;
    case WeightUpdate::kWPipe:
      return in_first_group(stage) ? 2 : 1;
  }
  return 1;
}

std::vector<int> weight_versions_per_rank(const VersionRule& rule,
                                          const std::vector<int>& stage_to_rank, int num_ranks) {
  std::vector<int> most(num_ranks, 1);
  for (size_t s = 0; s < stage_to_rank.size(); ++s) {
    int& r = most[stage_to_rank[s]];
    r = std::max(r, rule.versions_kept(static_cast<int>(s)));
  }
  return most;
}

bool VersionRule::fits_1f1b() const {
  return update != WeightUpdate::kTwoBW || microbatches_per_step >= stages - 1;
}

}  // namespace pptrain
