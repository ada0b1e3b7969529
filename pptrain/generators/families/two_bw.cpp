// PipeDream-2BW: 1F1B without a flush, a step after each mini-batch, the microbatches of step k
// on W^(k-1): W^(k+1) = W^(k) - opt(grad f(W^(k-1))), W^(-1) = W^(0); 2 versions per stage.
// docs/ASYNC.md.
#include <algorithm>

#include "pptrain/generators/families/families.h"

namespace pptrain {
namespace {

class TwoBWRule : public WeightRule {
 public:
  const char* name() const override { return "2bw"; }
  int forward_version(const VersionRule& r, int i, int /*stage*/) const override {
    return std::max(0, i / r.microbatches_per_step - 1);
  }
  int versions_kept(const VersionRule& /*r*/, int /*stage*/) const override { return 2; }
  // With fewer than S - 1 microbatches per step its stage 0 would run two steps ahead.
  bool fits_1f1b(const VersionRule& r) const override {
    return r.microbatches_per_step >= r.stages - 1;
  }
  bool ties_parameters() const override { return true; }
};

}  // namespace

std::vector<ScheduleEntry> two_bw_family() {
  static const TwoBWRule rule;
  return {async_1f1b("2bw",
                     "PipeDream-2BW (async): 1F1B without flush, step k's gradients taken on the "
                     "weights of step k-1; 2 versions per stage",
                     rule)};
}

}  // namespace pptrain
