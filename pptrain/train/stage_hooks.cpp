#include "pptrain/train/stage_hooks.h"

namespace pptrain {

std::unique_ptr<StageHooks> make_stage_hooks(const VersionRule& rule, Stage* live,
                                             const std::function<Stage()>& make_copy,
                                             const FamilyValues& family) {
  if (rule.predicts()) return make_weight_prediction(rule, live, make_copy);
  if (rule.update->corrects_delay()) return make_delay_correction(rule, live, make_copy, family);
  return nullptr;
}

}  // namespace pptrain
