// Deferred weight gradients for zero-bubble schedules: backward split into I and W.
//
// I computes the gradient for the stage's input (the previous stage waits for it); W computes
// the weight gradients later, in a bubble. The split happens inside the layers: while a
// DeferWeightGrads guard is alive, PipeLinear's backward computes only dX and pushes a closure
// for dW/db (holding the layer input and the output gradient) into the store. The executor keeps
// one store per (stage, microbatch):
//
//   WeightGradStore store;
//   {
//     DeferWeightGrads defer(&store);
//     output.backward(output_grad);   // I: input.grad is ready, PipeLinear weights untouched
//   }
//   ...
//   store.run();                      // W: accumulates into weight.grad / bias.grad
//
// Layers without such support (LayerNorm, Embedding) compute their weight gradients during I.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace pptrain {

class WeightGradStore {
 public:
  // Adds one deferred weight-gradient computation; `stash_bytes` is what it keeps alive.
  void push(std::function<void()> compute_weight_grad, int64_t stash_bytes);
  // Runs and clears all closures in the order they were pushed (W), freeing their stash.
  void run();
  bool empty() const { return closures_.empty(); }
  int64_t size() const { return static_cast<int64_t>(closures_.size()); }
  // Bytes held by the closures not yet run (inputs and output gradients).
  int64_t stash_bytes() const { return stash_bytes_; }

 private:
  std::vector<std::function<void()>> closures_;
  int64_t stash_bytes_ = 0;
};

// While alive, pipeline-aware layers push their weight gradients into `store` instead of
// computing them, in backward passes of CPU tensors run by this thread. Per thread, so ranks
// that run as threads of one process do not see each other's guard. Not reentrant: at most one
// guard per thread at a time (InternalError otherwise).
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradStore* store);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;
};

// The store of the live DeferWeightGrads guard, or nullptr when weight gradients run at once.
WeightGradStore* active_weight_grad_store();

}  // namespace pptrain
