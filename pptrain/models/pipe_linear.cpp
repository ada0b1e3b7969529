#include "pptrain/models/pipe_linear.h"

#include <cmath>
#include <cstdint>
#include <optional>

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

// Where a deferred gradient is added: a parameter itself, or the rows of one that a view of it
// is (the query and the key-value parts of MultiheadAttention's packed projection, which its
// cross-attention takes with split()).
struct GradTarget {
  torch::Tensor parameter;
  int64_t first_row = 0;
  int64_t rows = -1;  // -1: the whole parameter
};

// The GradTarget of `t`: a leaf, or a contiguous run of whole rows of a leaf it is a view of;
// none for anything else (its gradient then goes through autograd).
std::optional<GradTarget> grad_target(const torch::Tensor& t) {
  if (t.is_leaf()) return GradTarget{t};
  if (!t.is_view() || !t.is_contiguous()) return std::nullopt;
  const torch::Tensor base(t._base());
  if (!base.is_leaf() || !base.requires_grad() || !base.is_contiguous() || base.dim() != t.dim() ||
      base.scalar_type() != t.scalar_type()) {
    return std::nullopt;
  }
  const int64_t row = t.dim() == 2 ? base.size(1) : 1;
  const int64_t offset = t.storage_offset() - base.storage_offset();
  if ((t.dim() == 2 && t.size(1) != row) || offset % row != 0) return std::nullopt;
  return GradTarget{base, offset / row, t.size(0)};
}

void accumulate_grad(const GradTarget& target, torch::Tensor value) {
  if (!value.defined()) return;
  if (target.rows < 0) {
    accumulate_grad(target.parameter, std::move(value));
    return;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = target.parameter.mutable_grad();
  if (!grad.defined()) grad = torch::zeros_like(target.parameter);
  grad.narrow(0, target.first_row, target.rows).add_(value.to(grad.scalar_type()));
}

// y = x W^T + b whose backward can leave dW and db to a WeightGradStore.
struct PipeLinearFunction : public torch::autograd::Function<PipeLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias) {
    // Under autocast (device/precision.h) the product is in the compute dtype, as autocast's own
    // linear computes it: the input is kept in that dtype for dW, and the backward casts the
    // weight again rather than keeping a copy per microbatch (unless the step keeps one copy of
    // each weight for all its microbatches: StepCasts, below).
    const std::optional<c10::ScalarType> dtype = active_compute_dtype(input.device().type());
    const torch::Tensor kept = dtype && input.is_floating_point() ? input.to(*dtype) : input;
    // In a step that casts each weight once (StepCasts), the backward takes the step's copy.
    const torch::Tensor step_weight = dtype ? step_cast(weight, *dtype) : torch::Tensor();
    const torch::Tensor step_bias = dtype && bias ? step_cast(*bias, *dtype) : torch::Tensor();
    ctx->save_for_backward({kept, weight, step_weight});
    // (Only a cast input's own dtype is kept: the fp32 path stores nothing more.)
    if (kept.scalar_type() != input.scalar_type()) {
      ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    }
    // The bias is needed in backward only as the parameter whose .grad to fill. (It is an
    // optional because autograd refuses an undefined tensor as a Function input.)
    if (bias) ctx->saved_data["bias"] = *bias;
    if (step_weight.defined()) {
      return torch::linear(kept, step_weight,
                           step_bias.defined() ? c10::optional<torch::Tensor>(step_bias) : bias);
    }
    return torch::linear(kept, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];  // in the compute dtype under autocast
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& product_weight = saved[2].defined() ? saved[2] : weight;
    torch::Tensor bias;
    if (ctx->saved_data.count("bias")) bias = ctx->saved_data["bias"].toTensor();
    const torch::Tensor& grad_output = grad_outputs[0];  // [..., out]
    const c10::ScalarType input_dtype =
        ctx->saved_data.count("input_dtype")
            ? static_cast<c10::ScalarType>(ctx->saved_data["input_dtype"].toInt())
            : input.scalar_type();

    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {  // [..., in]
      grad_input = grad_output.matmul(product_weight.to(grad_output.scalar_type())).to(input_dtype);
    }

    const bool weight_needs = ctx->needs_input_grad(1);
    const bool bias_needs = bias.defined() && ctx->needs_input_grad(2);  // no edge without bias
    if (!weight_needs && !bias_needs) return {grad_input, torch::Tensor(), torch::Tensor()};

    // Deferred (the W of a zero-bubble schedule): x and dY held until store->run(). Writing
    // .grad directly bypasses autograd, so each gradient must go to a parameter or rows of one.
    WeightGradStore* store = active_weight_grad_store();
    const std::optional<GradTarget> weight_target =
        store && weight_needs ? grad_target(weight) : std::nullopt;
    const std::optional<GradTarget> bias_target =
        store && bias_needs ? grad_target(bias) : std::nullopt;
    if (store && weight_needs == weight_target.has_value() &&
        bias_needs == bias_target.has_value()) {
      store->push(
          [input, grad_output, weight_target, bias_target, weight_needs, bias_needs] {
            WeightGrads grads = compute_weight_grads(input, grad_output, weight_needs, bias_needs);
            if (weight_target) accumulate_grad(*weight_target, std::move(grads.weight));
            if (bias_target) accumulate_grad(*bias_target, std::move(grads.bias));
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
