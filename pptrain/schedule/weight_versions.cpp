#include "pptrain/schedule/weight_versions.h"

#include <algorithm>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

class SynchronousRule : public WeightRule {
 public:
  const char* name() const override { return "flush"; }
  bool asynchronous() const override { return false; }
  int forward_version(const VersionRule& r, int i, int /*stage*/) const override {
    return i / r.microbatches_per_step;
  }
  int versions_kept(const VersionRule& /*r*/, int /*stage*/) const override { return 1; }
  bool ties_parameters() const override { return true; }
};

}  // namespace

const WeightRule& synchronous_rule() {
  static const SynchronousRule rule;
  return rule;
}

int WeightRule::period(const VersionRule& r) const {
  return r.microbatches_per_step;
}

bool WeightRule::steps_after(const VersionRule& r, int i) const {
  return (i + 1) % r.period() == 0;
}

int VersionRule::forward_version(int i, int stage) const {
  PPTRAIN_ASSERT(i >= 0 && stage >= 0 && stage < stages && microbatches_per_step >= 1);
  return update->forward_version(*this, i, stage);
}

int VersionRule::backward_version(int i, int stage) const {
  PPTRAIN_ASSERT(i >= 0 && stage >= 0 && stage < stages && period() >= 1);
  return update->backward_version(*this, i, stage);
}

int VersionRule::oldest_needed_after(int i, int stage) const {
  // Versions never decrease with i, and every later action is of a microbatch > i, or the
  // forward of one not yet run (also > i in the 1F1B and one-process orders).
  return std::min(forward_version(i + 1, stage), backward_version(i + 1, stage));
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

}  // namespace pptrain
