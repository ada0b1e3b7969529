#include "pptrain/models/pipe_linear.h"

#include <cmath>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"
#include "pptrain/device/precision.h"
#include "pptrain/models/weight_grad_store.h"

namespace pptrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct WeightGrads {
  torch::Tensor weight;  // [out, in], undefined when not wanted
  torch::Tensor bias;    // [out], undefined when not wanted
};

// dW = dY^T x and db = sum dY, flattened over every leading dim.
WeightGrads compute_weight_grads(const torch::Tensor& input, const torch::Tensor& grad_output,
                                 bool want_weight, bool want_bias) {
  torch::NoGradGuard no_grad;
  auto grad_2d = grad_output.reshape({-1, grad_output.size(-1)});  // [rows, out]
  WeightGrads grads;
  if (want_weight) grads.weight = grad_2d.t().mm(input.reshape({-1, input.size(-1)}));
  if (want_bias) grads.bias = grad_2d.sum(0);
  return grads;
}

// Adds to a parameter's .grad the way autograd's AccumulateGrad does: a fresh tensor if the grad
// is undefined, else in place.
void accumulate_grad(const torch::Tensor& parameter, torch::Tensor value) {
  if (!value.defined()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = parameter.mutable_grad();
  if (grad.defined()) {
    grad.add_(value);
  } else {
    grad = value.to(parameter.scalar_type());  // a bf16 or fp16 product into an fp32 master
  }
}

// y = x W^T + b whose backward can leave dW and db to a WeightGradStore.
struct PipeLinearFunction : public torch::autograd::Function<PipeLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias) {
    // Under autocast (device/precision.h) the product is in the compute dtype, as autocast's own
    // linear computes it: the input is kept in that dtype for dW, and the backward casts the
    // weight again rather than keeping a copy per microbatch.
    const std::optional<c10::ScalarType> dtype = active_compute_dtype(input.device().type());
    const torch::Tensor kept = dtype && input.is_floating_point() ? input.to(*dtype) : input;
    ctx->save_for_backward({kept, weight});
    // (Only a cast input's own dtype is kept: the fp32 path stores nothing more.)
    if (kept.scalar_type() != input.scalar_type()) {
      ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    }
    // The bias is needed in backward only as the parameter whose .grad to fill. (It is an
    // optional because autograd refuses an undefined tensor as a Function input.)
    if (bias) ctx->saved_data["bias"] = *bias;
    return torch::linear(kept, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];  // in the compute dtype under autocast
    const torch::Tensor& weight = saved[1];
    torch::Tensor bias;
    if (ctx->saved_data.count("bias")) bias = ctx->saved_data["bias"].toTensor();
    const torch::Tensor& grad_output = grad_outputs[0];  // [..., out]
    const c10::ScalarType input_dtype =
        ctx->saved_data.count("input_dtype")
            ? static_cast<c10::ScalarType>(ctx->saved_data["input_dtype"].toInt())
            : input.scalar_type();

    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {  // [..., in]
      grad_input = grad_output.matmul(weight.to(grad_output.scalar_type())).to(input_dtype);
    }

    const bool weight_needs = ctx->needs_input_grad(1);
    const bool bias_needs = bias.defined() && ctx->needs_input_grad(2);  // no edge without bias
    if (!weight_needs && !bias_needs) return {grad_input, torch::Tensor(), torch::Tensor()};

    if (WeightGradStore* store = active_weight_grad_store()) {
      // Deferred (the W of a zero-bubble schedule): hold x and dY until store->run(). Writing
      // .grad directly bypasses autograd, so the parameters must be leaves.
      PPTRAIN_ASSERT(weight.is_leaf() && (!bias.defined() || bias.is_leaf()),
                     "deferred weight gradients need leaf parameters");
      store->push(
          [input, grad_output, weight, bias, weight_needs, bias_needs] {
            WeightGrads grads = compute_weight_grads(input, grad_output, weight_needs, bias_needs);
            accumulate_grad(weight, std::move(grads.weight));
            accumulate_grad(bias, std::move(grads.bias));
          },
          tensor_bytes(input) + tensor_bytes(grad_output));
      return {grad_input, torch::Tensor(), torch::Tensor()};
    }
    WeightGrads grads = compute_weight_grads(input, grad_output, weight_needs, bias_needs);
    const auto as_parameter = [](const torch::Tensor& g, const torch::Tensor& p) {
      return g.defined() ? g.to(p.scalar_type()) : g;
    };
    return {grad_input, as_parameter(grads.weight, weight), as_parameter(grads.bias, bias)};
  }
};

}  // namespace

PipeLinearImpl::PipeLinearImpl(const PipeLinearOptions& options_) : options(options_) {
  PPTRAIN_CHECK(options.in_features() > 0 && options.out_features() > 0,
                "PipeLinear features must be positive, got in=", options.in_features(),
                " out=", options.out_features());
  reset();
}

void PipeLinearImpl::reset() {
  weight =
      register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty({options.out_features()}));
  } else {
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  reset_parameters();
}

void PipeLinearImpl::reset_parameters() {
  // Same distribution as torch::nn::Linear: kaiming_uniform(a = sqrt(5)) on the weight is
  // uniform(-1/sqrt(in), 1/sqrt(in)), and the bias uses the same bound.
  torch::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
  weight.uniform_(-bound, bound);
  if (bias.defined()) bias.uniform_(-bound, bound);
}

torch::Tensor pipe_linear(const torch::Tensor& input, const torch::Tensor& weight,
                          const torch::Tensor& bias) {
  c10::optional<torch::Tensor> maybe_bias;
  if (bias.defined()) maybe_bias = bias;
  return PipeLinearFunction::apply(input, weight, maybe_bias);
}

torch::Tensor PipeLinearImpl::forward(const torch::Tensor& input) {
  return pipe_linear(input, weight, bias);
}

void PipeLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "pptrain::PipeLinear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ")";
}

}  // namespace pptrain
