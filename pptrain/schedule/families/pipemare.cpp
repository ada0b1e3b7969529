// PipeMare: 1F1B without a flush, no stash (1 version), a step after each mini-batch; the
// forward of i uses the newest weights at its time, W_s^((i-(S-1-s))/M), its backward the newest
// at its own, W_s^(i/M), rerunning the forward there; per-stage learning rate and discrepancy
// correction in training (train/pipemare.h). docs/ASYNC.md.
#include "pptrain/schedule/families/families.h"

namespace pptrain {
namespace {

class PipeMareRule : public OneVersionRule {
 public:
  const char* name() const override { return "pipemare"; }
  bool corrects_delay() const override { return true; }
};

}  // namespace

std::vector<ScheduleEntry> pipemare_family() {
  static const PipeMareRule rule;
  return {async_1f1b("pipemare",
                     "PipeMare (async): 1F1B without flush, no stash (1 version): the backward "
                     "reruns the forward on the newest weights, corrected by the recent updates; "
                     "per-stage learning rate",
                     rule)};
}

}  // namespace pptrain
