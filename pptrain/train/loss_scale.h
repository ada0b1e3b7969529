// fp16's dynamic loss scale for a whole pipeline, as torch's GradScaler keeps one for a model:
// the backwards start from `scale()` (runtime/executor.h: set_loss_scale), the gradients are
// divided by it before clipping, and a step whose gradients overflowed (a global gradient norm
// that is not finite) is skipped and halves the scale; `growth_interval` finite steps in a row
// double it.
//
//   LossScale scale(LossScaleOptions{});
//   executor.set_loss_scale(scale.scale());
//   ... backwards; unscale(params, scale.scale()); norm = global norm ...
//   if (scale.update(std::isfinite(norm))) step();   // false: skipped, scale halved
//
// Every rank of the run must take the same decision, so update() is given a norm every rank has
// (the all-reduced one, which covers every stage and every data-parallel copy): the ranks then
// skip the same steps and move their scales alike, with no message of their own.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "pptrain/runtime/tensor_file.h"

namespace pptrain {

struct LossScaleOptions {
  double init_scale = 65536;  // 2^16, GradScaler's
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // finite steps in a row before the scale grows
};

class LossScale {
 public:
  explicit LossScale(LossScaleOptions options);

  double scale() const { return scale_; }
  // After a step's backwards: whether its gradients were finite (then the optimizer steps),
  // moving the scale. Returns `finite`.
  bool update(bool finite);
  int growth_tracker() const { return growth_tracker_; }
  int skipped_steps() const { return skipped_; }

  // Its state in a checkpoint ("loss_scale/scale", "loss_scale/growth_tracker",
  // "loss_scale/skipped") and back; UserError starting with `flag` when `state` lacks it.
  void save_state(NamedTensors& state) const;
  void load_state(const NamedTensors& state, const std::string& flag);

 private:
  LossScaleOptions options_;
  double scale_;
  int growth_tracker_ = 0;
  int skipped_ = 0;
};

// Divides the gradients of `params` by `scale` (a power of two: exactly), in place.
void unscale_gradients(const std::vector<torch::Tensor>& params, double scale);

}  // namespace pptrain
