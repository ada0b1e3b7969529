#include "pptrain/train/loss_scale.h"

#include "pptrain/common/check.h"

namespace pptrain {

LossScale::LossScale(LossScaleOptions options) : options_(options), scale_(options.init_scale) {
  PPTRAIN_CHECK(options_.init_scale > 0 && options_.growth_factor >= 1 &&
                    options_.backoff_factor > 0 && options_.backoff_factor < 1 &&
                    options_.growth_interval >= 1,
                "a loss scale needs init_scale > 0, growth_factor >= 1, 0 < backoff_factor < 1 "
                "and growth_interval >= 1");
}

bool LossScale::update(bool finite) {
  if (!finite) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

void LossScale::save_state(NamedTensors& state) const {
  state["loss_scale/scale"] = torch::tensor(scale_, torch::kFloat64);
  state["loss_scale/growth_tracker"] = number_tensor(growth_tracker_);
  state["loss_scale/skipped"] = number_tensor(skipped_);
}

void LossScale::load_state(const NamedTensors& state, const std::string& flag) {
  scale_ = tensor_named(state, "loss_scale/scale", flag).item<double>();
  PPTRAIN_CHECK(scale_ > 0, flag, ": the checkpoint's loss scale is ", scale_);
  growth_tracker_ = static_cast<int>(number_of(state, "loss_scale/growth_tracker", flag));
  skipped_ = static_cast<int>(number_of(state, "loss_scale/skipped", flag));
}

void unscale_gradients(const std::vector<torch::Tensor>& params, double scale) {
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.mutable_grad().mul_(1.0 / scale);
  }
}

}  // namespace pptrain
