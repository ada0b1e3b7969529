// What a run's precision (common/precision.h) means to LibTorch: the dtype its stages compute in,
// and the scope in which the CPU's autocast casts an operation's inputs to it.
//
//   AutocastScope scope(compute_dtype(Precision::kBf16));   // linear, matmul... in bf16 here
//   torch::Tensor y = layer->forward(x);                    // y: bf16
//
// Autocast is the calling thread's state, on the CPU and on CUDA devices alike (a stage computes
// on one of them); the scope restores what it found. Alone, it caches no casts of the
// parameters (a stage's forward uses each weight once), so each cast is freed after its
// operation unless the backward keeps it; a cache a caller's own scope kept is dropped when the
// outermost scope ends, so that a step's update is never hidden behind a stale copy.
//
// Inside a StepCasts scope (one synchronous step, whose weights do not change until its end)
// the scopes do cache: each parameter is cast once for all the step's microbatches and their
// backwards, and the copies are dropped when the step's scope ends, before the optimizer steps.
//
//   { StepCasts casts(compute_dtype(Precision::kBf16));   // the step
//     ... every F, I, W, B of the step ...
//   }                                                      // copies freed: now step
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

// While it lives, the calling thread's autocast scopes keep each parameter's cast (torch's
// autocast cache, at::autocast::cached_cast) until it ends. nullopt: does nothing (fp32).
class StepCasts {
 public:
  explicit StepCasts(std::optional<c10::ScalarType> dtype);
  ~StepCasts();
  StepCasts(const StepCasts&) = delete;
  StepCasts& operator=(const StepCasts&) = delete;

 private:
  bool outer_;  // the calling thread's first open StepCasts
};

// Whether a StepCasts scope is open on the calling thread.
bool step_casts_open();

// Inside an autocast scope and a StepCasts scope: `parameter` (a float32 leaf) in `dtype`, cast
// at its first use in the step and shared by every later one (with the parameter's autograd
// history, also when called where grad mode is off, as in a custom Function's forward); outside
// a StepCasts scope, undefined (the caller casts as autocast would).
torch::Tensor step_cast(const torch::Tensor& parameter, c10::ScalarType dtype);

// The dtype an autocast scope of the calling thread computes in on `device` (a tensor's
// device().type()); nullopt outside one.
std::optional<c10::ScalarType> active_compute_dtype(c10::DeviceType device = c10::DeviceType::CPU);

}  // namespace pptrain
