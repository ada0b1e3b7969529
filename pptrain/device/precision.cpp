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

AutocastScope::AutocastScope(std::optional<c10::ScalarType> dtype)
    : was_enabled_(at::autocast::is_autocast_enabled(c10::DeviceType::CPU)),
      was_dtype_(at::autocast::get_autocast_dtype(c10::DeviceType::CPU)),
      was_caching_(at::autocast::is_autocast_cache_enabled()),
      counted_(dtype.has_value()) {
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, dtype.has_value());
  if (dtype) {
    at::autocast::set_autocast_dtype(c10::DeviceType::CPU, *dtype);
    // A scope is one stage's forward of one microbatch, which uses each weight once: a cached
    // cast would save no work, and would hold every layer's cast until the scope ends.
    at::autocast::set_autocast_cache_enabled(false);
    at::autocast::increment_nesting();
  }
}

AutocastScope::~AutocastScope() {
  // The outermost scope drops the parameters' cached casts (torch.autocast's __exit__ does it).
  if (counted_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cache_enabled(was_caching_);
  at::autocast::set_autocast_dtype(c10::DeviceType::CPU, was_dtype_);
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, was_enabled_);
}

std::optional<c10::ScalarType> active_compute_dtype() {
  if (!at::autocast::is_autocast_enabled(c10::DeviceType::CPU)) return std::nullopt;
  return at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
}

}  // namespace pptrain
