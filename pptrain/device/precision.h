// What a run's precision (common/precision.h) means to LibTorch: the dtype its stages compute in,
// and the scope in which the CPU's autocast casts an operation's inputs to it.
//
//   AutocastScope scope(compute_dtype(Precision::kBf16));   // linear, matmul... in bf16 here
//   torch::Tensor y = layer->forward(x);                    // y: bf16
//
// Autocast is the calling thread's state, on the CPU and on CUDA devices alike (a stage computes
// on one of them); the scope restores what it found. It caches no casts of
// the parameters (a stage's forward uses each weight once), so each cast is freed after its
// operation unless the backward keeps it; a cache a caller's own scope kept is dropped when the
// outermost scope ends, so that a step's update is never hidden behind a stale copy.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "pptrain/common/precision.h"

namespace pptrain {

// The dtype the layers compute in; nullopt for fp32 (no autocast, nothing cast).
std::optional<c10::ScalarType> compute_dtype(Precision precision);

class AutocastScope {
 public:
  // nullopt: autocast off inside, as fp32 computes (a loss inside a bf16 forward's scope).
  explicit AutocastScope(std::optional<c10::ScalarType> dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool was_enabled_[2];  // CPU, CUDA
  c10::ScalarType was_dtype_[2];
  bool was_caching_;
  bool counted_;  // entered the nesting count (an enabled scope)
};

// The dtype an autocast scope of the calling thread computes in on `device` (a tensor's
// device().type()); nullopt outside one.
std::optional<c10::ScalarType> active_compute_dtype(c10::DeviceType device = c10::DeviceType::CPU);

}  // namespace pptrain
