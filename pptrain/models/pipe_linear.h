// PipeLinear: a linear layer whose weight gradient can be deferred (see weight_grad_store.h).
//
//   PipeLinear proj(PipeLinearOptions(64, 256));   // like torch::nn::Linear(64, 256)
//   auto y = proj(x);                             // x [..., 64] -> y [..., 256]
//
// Forward is y = x W^T + b. Backward computes dX = dY W at once; dW = dY^T x and db = sum dY
// (flattened over the leading dims) are computed at once too, unless a DeferWeightGrads guard is
// alive, in which case a closure that accumulates them into weight.grad / bias.grad is pushed to
// the guard's store; the closure adds them to the parameter's .grad, or to the rows of one that
// a weight given as a contiguous view of whole rows covers (pipe_linear() of a slice), and a
// weight that is neither (one computed from parameters) gets its gradient through autograd at
// once. With no guard it behaves exactly like torch::nn::Linear, initialisation
// included (uniform(-1/sqrt(in), 1/sqrt(in)) for weight and bias).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace pptrain {

struct PipeLinearOptions {
  PipeLinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
};

class PipeLinearImpl : public torch::nn::Cloneable<PipeLinearImpl> {
 public:
  PipeLinearImpl(int64_t in_features, int64_t out_features)
      : PipeLinearImpl(PipeLinearOptions(in_features, out_features)) {}
  explicit PipeLinearImpl(const PipeLinearOptions& options);

  void reset() override;
  void reset_parameters();
  // x [..., in_features] -> [..., out_features]
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  PipeLinearOptions options;
  torch::Tensor weight;  // [out_features, in_features]
  torch::Tensor bias;    // [out_features], undefined without bias
};
TORCH_MODULE(PipeLinear);

// y = x W^T + b with PipeLinear's backward (its weight gradients deferred under a
// DeferWeightGrads guard): the layer's forward for parameters held elsewhere (the Python
// package's pptrain.Linear). `bias` may be undefined.
torch::Tensor pipe_linear(const torch::Tensor& input, const torch::Tensor& weight,
                          const torch::Tensor& bias);

}  // namespace pptrain
