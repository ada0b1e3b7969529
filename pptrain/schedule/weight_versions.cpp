#include "pptrain/schedule/weight_versions.h"

#include <algorithm>

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
  }
  return "?";
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
    case WeightUpdate::kPipeMare:
      // Stage s runs S-1-s forwards ahead, so i's forward comes after the backwards of
      // microbatches 0 .. i-(S-s)-1, and a step follows every M-th backward.
      return std::max(0, i - (stages - 1 - stage)) / microbatches_per_step;
  }
  return 0;
}

int VersionRule::backward_version(int i, int stage) const {
  if (update != WeightUpdate::kPipeMare) return forward_version(i, stage);
  PPTRAIN_ASSERT(i >= 0 && stage >= 0 && stage < stages && microbatches_per_step >= 1);
  return i / microbatches_per_step;  // after the backwards of 0 .. i-1
}

int VersionRule::delay(int stage) const {
  if (update != WeightUpdate::kPipeMare) return 0;
  return (stages - 1 - stage + microbatches_per_step - 1) / microbatches_per_step;
}

bool VersionRule::steps_after(int i) const {
  switch (update) {
    case WeightUpdate::kPipeDream:
    case WeightUpdate::kVerticalSync:
      return true;
    case WeightUpdate::kFlush:
    case WeightUpdate::kTwoBW:
    case WeightUpdate::kPipeMare:
      return (i + 1) % microbatches_per_step == 0;
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
      return 1;
    case WeightUpdate::kPipeDream:
      return stages - stage;
    case WeightUpdate::kVerticalSync:
      return stages;
    case WeightUpdate::kTwoBW:
      return 2;
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
