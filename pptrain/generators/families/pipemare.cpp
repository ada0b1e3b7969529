// PipeMare: 1F1B without a flush, no stash (1 version), a step after each mini-batch; the
// forward of i uses the newest weights at its time, W_s^((i-(S-1-s))/M), its backward the newest
// at its own, W_s^(i/M), rerunning the forward there; per-stage learning rate and discrepancy
// correction in training (train/pipemare.h). docs/ASYNC.md.
#include "pptrain/generators/families/families.h"

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
  using Kind = FamilyOption::Kind;
  ScheduleEntry entry =
      async_1f1b("pipemare",
                 "PipeMare (async): 1F1B without flush, no stash (1 version): the backward "
                 "reruns the forward on the newest weights, corrected by the recent updates; "
                 "per-stage learning rate",
                 rule);
  // Training reads them (train/pipemare.h: pipemare_options()).
  entry.options = {
      {"--no-lr-reschedule",
       "pipemare: every stage at --lr from the first step (default: divided by the stage's "
       "delay, annealed to --lr over --pipemare-warmup steps)",
       Kind::kSwitch},
      {"--no-discrepancy-correction",
       "pipemare: the backward on the newest weights as they are (default: moved back by the "
       "recent updates towards the weights its forward saw)",
       Kind::kSwitch},
      {"--pipemare-warmup",
       "pipemare: steps over which the rescheduled rate reaches --lr (default 100)", Kind::kInt, 0},
      {"--pipemare-decay",
       "pipemare: D in [0, 1) of the correction's running average, which keeps D^(1/delay) of "
       "its old value per step (default 0.1)",
       Kind::kNumber, 0, 1},
  };
  return {entry};
}

}  // namespace pptrain
