// PipeMare's two fixes for the stale weights of its pipeline (docs/ASYNC.md gives the formulas
// and their source). PipeMare keeps one version per stage: a microbatch's forward runs on the
// newest weights at its time, its backward on the newest at its own, `delay` optimizer steps
// later at most (VersionRule::delay). The fixes, each on by default:
//
// - Learning-rate rescheduling (T1): stage s's k-th step uses lr * tau_s^-(1 - min(k / K, 1)),
//   tau_s its delay: the rate starts divided by the delay and anneals to lr over K steps.
// - Discrepancy correction (T2): the backward of a microbatch whose forward ran d steps earlier
//   uses w - d * delta instead of w, an estimate of the weights its forward saw; delta is a
//   running average of the stage's recent steps, delta <- g * delta + (1 - g) * (w_new - w_old),
//   with g = D^(1 / tau_s).
//
//   PipeMareStage fixes(&live, make_copy, /*delay=*/2, options);
//   Stage& w = fixes.backward_weights(newest, /*lag=*/1);   // newest - delta, or newest
//   ... backward on w ...
//   fixes.gradients_to(newest);                           // w's gradients join newest's
//   optimizer.param_groups()[0].options().set_lr(lr * fixes.lr_scale(step));
//   fixes.before_step(); optimizer.step(); fixes.after_step();
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/tensor_file.h"
#include "pptrain/train/weight_prediction.h"

namespace pptrain {

struct PipeMareOptions {
  bool lr_reschedule = true;  // T1
  bool correction = true;     // T2
  int warmup_steps = 100;     // K: the steps over which T1's rate anneals to the base rate
  double decay = 0.1;         // D: T2's average keeps g = D^(1 / delay) of its old value
};

// The fixes as the family's options given for a run say (generators/families/pipemare.cpp:
// --no-lr-reschedule, --no-discrepancy-correction, --pipemare-warmup, --pipemare-decay, checked
// there), the defaults above for those not given.
PipeMareOptions pipemare_options(const FamilyValues& given);

// T1's factor for a stage `delay` steps behind at its `step`-th optimizer step (0-based):
// delay^-(1 - min(step / warmup_steps, 1)); 1 for a delay of 0 or 1.
double pipemare_lr_scale(int delay, int step, int warmup_steps);

// The fixes of one stage. Does nothing but scale the rate when the stage has no delay or the
// options turn them off.
class PipeMareStage {
 public:
  // `live` (not owned) is the stage its optimizer steps; `make_copy` builds a Stage of the same
  // layers, for the corrected weights.
  PipeMareStage(Stage* live, std::function<Stage()> make_copy, int delay,
                const PipeMareOptions& options);

  double lr_scale(int step) const;
  // The weights for a backward `lag` steps after its forward, `newest` being the weights of the
  // stage's current version: newest - lag * delta with the correction, else `newest`.
  Stage& backward_weights(Stage& newest, int lag);
  // After a backward on backward_weights(newest, ...): its gradients are added to `newest`'s.
  void gradients_to(Stage& newest);
  // Around each optimizer step of the live weights: the running average of the steps.
  void before_step();
  void after_step();
  // Weight-sized buffers it holds beside the stage's versions: delta and the corrected copy.
  // For a checkpoint between steps: the running average of the steps, under `prefix`; and back.
  void save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const std::string& prefix, const NamedTensors& in, const std::string& flag);
  int buffers() const { return (delta_.empty() ? 0 : 1) + (corrected_.made() ? 1 : 0); }

 private:
  bool corrects() const { return options_.correction && delay_ > 0; }

  Stage* live_;
  int delay_;
  PipeMareOptions options_;
  double keep_ = 0;                   // g = D^(1 / delay)
  std::vector<torch::Tensor> delta_;  // per parameter of the stage
  ShiftedWeights corrected_;          // the weights the last corrected backward ran on
  bool corrected_pending_ = false;    // its gradients are not yet added to the newest weights
};

}  // namespace pptrain
