#include "pptrain/device/precision.h"

#include <ATen/autocast_mode.h>

namespace pptrain {

std::optional<c10::ScalarType> compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return std::nullopt;
    case Precision::kBf16:
      return c10::kBFloat16;
    case Precision::kFp16:
      return c10::kHalf;
  }
  return std::nullopt;
}

namespace {
// A stage computes on the CPU or on its CUDA device; one scope turns autocast on for both (a
// device's flag changes nothing for another's tensors).
constexpr c10::DeviceType kAutocastDevices[] = {c10::DeviceType::CPU, c10::DeviceType::CUDA};

thread_local bool step_casts_open_ = false;
}  // namespace

bool step_casts_open() {
  return step_casts_open_;
}

torch::Tensor step_cast(const torch::Tensor& parameter, c10::ScalarType dtype) {
  if (!step_casts_open_ || !parameter.defined()) return torch::Tensor();
  const at::AutoGradMode with_history(true);
  return at::autocast::cached_cast(dtype, parameter, parameter.device().type());
}

StepCasts::StepCasts(std::optional<c10::ScalarType> dtype)
    : outer_(dtype.has_value() && !step_casts_open_) {
  if (!outer_) return;
  step_casts_open_ = true;
  // Counted as a scope, so that the stages' own scopes ending do not drop the step's casts.
  at::autocast::increment_nesting();
}

StepCasts::~StepCasts() {
  if (!outer_) return;
  step_casts_open_ = false;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

AutocastScope::AutocastScope(std::optional<c10::ScalarType> dtype)
    : was_caching_(at::autocast::is_autocast_cache_enabled()), counted_(dtype.has_value()) {
  for (size_t i = 0; i < 2; ++i) {
    const c10::DeviceType device = kAutocastDevices[i];
    was_enabled_[i] = at::autocast::is_autocast_enabled(device);
    was_dtype_[i] = at::autocast::get_autocast_dtype(device);
    at::autocast::set_autocast_enabled(device, dtype.has_value());
    if (dtype) at::autocast::set_autocast_dtype(device, *dtype);
  }
  if (dtype) {
    // A scope is one stage's forward of one microbatch, which uses each weight once: a cached
    // cast would save no work, and would hold every layer's cast until the scope ends; unless
    // the step's microbatches share the casts (StepCasts).
    at::autocast::set_autocast_cache_enabled(step_casts_open_);
    at::autocast::increment_nesting();
  }
}

AutocastScope::~AutocastScope() {
  // The outermost scope drops the parameters' cached casts (torch.autocast's __exit__ does it).
  if (counted_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cache_enabled(was_caching_);
  for (size_t i = 0; i < 2; ++i) {
    at::autocast::set_autocast_dtype(kAutocastDevices[i], was_dtype_[i]);
    at::autocast::set_autocast_enabled(kAutocastDevices[i], was_enabled_[i]);
  }
}

std::optional<c10::ScalarType> active_compute_dtype(c10::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device)) return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

}  // namespace pptrain
