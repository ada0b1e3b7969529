// What an asynchronous family adds to the updates of one stage beyond its weight versions (its
// training half; the rule itself is schedule/weight_versions.h): weights a pass runs on other
// than its version's (pipemare's corrected backward weights, a predicting rule's extrapolated
// ones), a factor on the learning rate, what it keeps across optimizer steps, and that state in
// a checkpoint. AsyncUpdates (updates.h) calls the hooks; it knows no family.
//
//   std::unique_ptr<StageHooks> hooks = make_stage_hooks(rule, live, make_copy, family);
//   Stage& w = hooks ? hooks->weights(mb, backward, versions) : versions.weights(version);
//   ... the backward on w ...
//   if (hooks) hooks->gradients_to(versions.weights(version));
//   optimizer.set_lr(lr * hooks->lr_scale(step)); hooks->before_step(); optimizer.step();
//   hooks->after_update({true, optimizer, live, versions.live_version(), lr, oldest});
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "pptrain/generators/registry.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/stage_versions.h"
#include "pptrain/runtime/tensor_file.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/train/optimizer.h"

namespace pptrain {

// A stage's update as the hooks see it after its optimizer step (or the step it skipped).
struct StageUpdate {
  bool stepped = false;  // false: the gradient norm was not finite and the step was skipped
  const StageOptimizer& optimizer;
  const Stage& live;
  int live_version = 0;   // the version the live weights are now
  double lr = 0;          // the step's rate before lr_scale()
  int oldest_needed = 0;  // no later action starts from an older version
};

class StageHooks {
 public:
  virtual ~StageHooks() = default;

  // The weights the forward or backward of microbatch `mb` runs on; `versions` holds the
  // stage's versions, of which the rule's is the plain answer.
  virtual Stage& weights(int mb, bool backward, StageVersions& versions) = 0;
  // After a backward on weights(mb, true, ...): its gradients join `target`'s, the version's.
  virtual void gradients_to(Stage& target) = 0;
  // The factor on the learning rate of the stage's `step`-th optimizer step (0-based).
  virtual double lr_scale(int /*step*/) const { return 1; }
  // Just before the optimizer step, when the stage takes it.
  virtual void before_step() {}
  // After the update, whether it stepped or skipped.
  virtual void after_update(const StageUpdate& /*update*/) {}
  // Copies of the weights it holds that count as versions held (predictions), and those that do
  // not (buffers beside them); both count in the stage's weight bytes.
  virtual int versions_held() const { return 0; }
  virtual int buffers() const { return 0; }
  // For a checkpoint between two steps: its state under `prefix`; and back (UserError starting
  // with `flag`).
  virtual void save_state(const std::string& prefix, NamedTensors& out) const = 0;
  virtual void load_state(const std::string& prefix, const NamedTensors& in,
                          const std::string& flag) = 0;
};

// The hooks of `rule` for stage `live` (not owned): null when its family has none. `make_copy`
// builds a Stage of the same layers; `family` holds the family's options that were given.
std::unique_ptr<StageHooks> make_stage_hooks(const VersionRule& rule, Stage* live,
                                             const std::function<Stage()>& make_copy,
                                             const FamilyValues& family);

// The hooks of the families that correct their delay (weight_versions.h: corrects_delay()) and
// of those that predict (predicts()); each defined in its family's training file.
std::unique_ptr<StageHooks> make_delay_correction(const VersionRule& rule, Stage* live,
                                                  const std::function<Stage()>& make_copy,
                                                  const FamilyValues& family);
std::unique_ptr<StageHooks> make_weight_prediction(const VersionRule& rule, Stage* live,
                                                   const std::function<Stage()>& make_copy);

}  // namespace pptrain
