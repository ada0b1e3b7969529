#include "pptrain/models/weight_grad_store.h"

#include <atomic>
#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {
// Process-wide on purpose: autograd may run a backward on one of its own threads, where a
// thread-local guard set by the caller would not be seen.
std::atomic<WeightGradStore*> active_store{nullptr};
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
  WeightGradStore* expected = nullptr;
  // Leaves the live guard in place when it throws, so that guard still clears it on exit.
  PPTRAIN_ASSERT(active_store.compare_exchange_strong(expected, store),
                 "DeferWeightGrads is not reentrant");
}

DeferWeightGrads::~DeferWeightGrads() {
  active_store.store(nullptr);
}

WeightGradStore* active_weight_grad_store() {
  return active_store.load();
}

}  // namespace pptrain
