#include "pptrain/models/weight_grad_store.h"

#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {
// One per thread, so that ranks running as threads of one process (the loopback tests) each
// defer into their own store. That still reaches PipeLinear's backward because LibTorch's
// engine runs a backward of CPU tensors on the thread that called it; only CUDA/XPU work moves
// to the engine's device threads, where this guard would not be seen (the runtime is CPU-only).
thread_local WeightGradStore* active_store = nullptr;
}  // namespace

void WeightGradStore::push(std::function<void()> compute_weight_grad, int64_t stash_bytes) {
  PPTRAIN_ASSERT(compute_weight_grad, "empty weight-gradient closure");
  closures_.push_back(std::move(compute_weight_grad));
  stash_bytes_ += stash_bytes;
}

void WeightGradStore::run() {
  // Move the closures out first so that their captured tensors are freed as soon as each has run,
  // and so that a closure which throws leaves the store empty rather than half-run.
  std::vector<std::function<void()>> closures = std::move(closures_);
  closures_.clear();
  stash_bytes_ = 0;
  for (auto& closure : closures) {
    closure();
    closure = nullptr;
  }
}

DeferWeightGrads::DeferWeightGrads(WeightGradStore* store) {
  PPTRAIN_ASSERT(store != nullptr, "DeferWeightGrads needs a store");
  // Leaves the live guard in place when it throws, so that guard still clears it on exit.
  PPTRAIN_ASSERT(active_store == nullptr, "DeferWeightGrads is not reentrant");
  active_store = store;
}

DeferWeightGrads::~DeferWeightGrads() {
  active_store = nullptr;
}

WeightGradStore* active_weight_grad_store() {
  return active_store;
}

}  // namespace pptrain
