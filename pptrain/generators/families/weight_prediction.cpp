// The weight-predicting family: 1F1B without a flush, forward and backward on weights predicted
// from the newest ones along the optimizer's smoothed direction (train/weight_prediction.h).
// SpecTrain steps after every backward and predicts per microbatch; XPipe steps per mini-batch
// and predicts once per mini-batch, at its first microbatch ("the bellwether"). The lags are the
// papers' formulas (docs/ASYNC.md).
#include <cmath>

#include "pptrain/common/check.h"
#include "pptrain/generators/families/families.h"

namespace pptrain {
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

class PredictingRule : public NewestWeightsRule {
 public:
  bool predicts() const override { return true; }
};

// Forward lag floor(s/2) + S-1-s, backward floor(s/2); one predicted copy serves both passes,
// one at a time.
class SpecTrainRule : public PredictingRule {
 public:
  const char* name() const override { return "spectrain"; }
  int period(const VersionRule& /*r*/) const override { return 1; }
  int prediction_lag(const VersionRule& r, int stage, bool backward) const override {
    PPTRAIN_ASSERT(stage >= 0 && stage < r.stages);
    const int half = stage / 2;
    return backward ? half : half + r.stages - 1 - stage;
  }
  int versions_kept(const VersionRule& r, int stage) const override {
    return r.prediction_lag(stage, false) > 0 || r.prediction_lag(stage, true) > 0 ? 2 : 1;
  }
};

// Forward lag round((S + M - s/2 - 2) / M), backward round((M - 1 + floor(s/2)) / M), ties to
// even; the mini-batch's forward and backward predictions are kept side by side.
class XPipeRule : public PredictingRule {
 public:
  const char* name() const override { return "xpipe"; }
  int prediction_lag(const VersionRule& r, int stage, bool backward) const override {
    PPTRAIN_ASSERT(stage >= 0 && stage < r.stages);
    const double m = r.microbatches_per_step;
    return backward ? round_half_even((m - 1 + stage / 2) / m)
                    : round_half_even((r.stages + m - stage / 2.0 - 2) / m);
  }
  int prediction_group(const VersionRule& r) const override { return r.microbatches_per_step; }
  int versions_kept(const VersionRule& r, int stage) const override {
    return 1 + (r.prediction_lag(stage, false) > 0 ? 1 : 0) +
           (r.prediction_lag(stage, true) > 0 ? 1 : 0);
  }
};

}  // namespace

std::vector<ScheduleEntry> weight_prediction_family() {
  static const SpecTrainRule spectrain;
  static const XPipeRule xpipe;
  return {
      async_1f1b("spectrain",
                 "SpecTrain (async): 1F1B without flush, a step after every microbatch; forward "
                 "and backward on weights predicted along the optimizer's smoothed direction",
                 spectrain),
      async_1f1b("xpipe",
                 "XPipe (async): 1F1B without flush, a step per mini-batch; forward and backward "
                 "on weights predicted once per mini-batch along the optimizer's direction",
                 xpipe),
  };
}

}  // namespace pptrain
