#include "pptrain/models/pipe_linear.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "pptrain/common/check.h"
#include "pptrain/device/precision.h"
#include "pptrain/models/model.h"
#include "pptrain/models/weight_grad_store.h"

namespace pptrain {
namespace {

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tol = 1e-6) {
  ASSERT_TRUE(actual.defined());
  ASSERT_TRUE(expected.defined());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(torch::allclose(actual, expected, tol, tol))
      << "max abs diff " << (actual - expected).abs().max().item<double>();
}

// Parameter gradients by name, cloned (undefined grads stay undefined).
std::map<std::string, torch::Tensor> grads_of(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : module.named_parameters()) {
    grads[item.key()] =
        item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor();
  }
  return grads;
}

TEST(PipeLinear, MatchesTorchLinearWithoutDeferral) {
  for (bool with_bias : {true, false}) {
    torch::manual_seed(1);
    PipeLinear pipe(PipeLinearOptions(5, 7).bias(with_bias));
    torch::nn::Linear reference(torch::nn::LinearOptions(5, 7).bias(with_bias));
    {
      torch::NoGradGuard no_grad;
      reference->weight.copy_(pipe->weight);
      if (with_bias) reference->bias.copy_(pipe->bias);
    }
    auto x = torch::randn({2, 3, 5}, torch::requires_grad());
    auto x_ref = x.detach().clone().requires_grad_(true);
    auto y = pipe(x);
    auto y_ref = reference(x_ref);
    expect_close(y, y_ref);
    auto grad = torch::randn_like(y);
    y.backward(grad);
    y_ref.backward(grad);
    expect_close(x.grad(), x_ref.grad());
    expect_close(pipe->weight.grad(), reference->weight.grad());
    if (with_bias) {
      expect_close(pipe->bias.grad(), reference->bias.grad());
    } else {
      EXPECT_FALSE(pipe->bias.defined());
    }
  }
}

// Under autocast (a bf16 or fp16 run) PipeLinear computes what torch's Linear does there: the
// product in the compute dtype, and float32 gradients for its float32 (master) parameters,
// deferred (I then W) or not.
TEST(PipeLinear, UnderAutocastComputesAsTorchLinearDoes) {
  for (c10::ScalarType dtype : {c10::kBFloat16, c10::kHalf}) {
    for (bool defer : {false, true}) {
      torch::manual_seed(4);
      PipeLinear pipe(PipeLinearOptions(5, 7));
      torch::nn::Linear reference(torch::nn::LinearOptions(5, 7));
      {
        torch::NoGradGuard no_grad;
        reference->weight.copy_(pipe->weight);
        reference->bias.copy_(pipe->bias);
      }
      auto x = torch::randn({2, 3, 5}, torch::requires_grad());
      auto x_ref = x.detach().clone().requires_grad_(true);
      torch::Tensor y, y_ref;
      {
        AutocastScope scope(dtype);
        y = pipe(x);
        y_ref = reference(x_ref);
      }
      ASSERT_EQ(y.scalar_type(), dtype);
      ASSERT_EQ(y_ref.scalar_type(), dtype);
      // (Not bit for bit: autocast's linear with autograd multiplies and adds in two kernels.)
      expect_close(y.to(torch::kFloat), y_ref.to(torch::kFloat), 2e-2);
      const auto grad = torch::randn_like(y);
      WeightGradStore store;
      {
        std::optional<DeferWeightGrads> deferred;
        if (defer) deferred.emplace(&store);
        y.backward(grad);
      }
      store.run();
      y_ref.backward(grad);
      EXPECT_EQ(x.grad().scalar_type(), c10::kFloat);
      EXPECT_EQ(pipe->weight.grad().scalar_type(), c10::kFloat);
      EXPECT_EQ(pipe->bias.grad().scalar_type(), c10::kFloat);
      expect_close(x.grad(), x_ref.grad(), 1e-3);
      expect_close(pipe->weight.grad(), reference->weight.grad(), 1e-2);
      expect_close(pipe->bias.grad(), reference->bias.grad(), 1e-2);
    }
  }
}

// A step whose casts are kept (StepCasts) computes bit for bit what casting at every use does:
// the same bf16 copy of the weight, made once. Two microbatches, deferred or not.
TEST(PipeLinear, StepCastsComputeWhatCastsPerUseDo) {
  for (bool defer : {false, true}) {
    std::vector<std::map<std::string, torch::Tensor>> grads;
    std::vector<torch::Tensor> outputs;
    for (bool per_step : {false, true}) {
      torch::manual_seed(5);
      PipeLinear pipe(PipeLinearOptions(5, 7));
      const StepCasts casts(per_step ? std::optional<c10::ScalarType>(c10::kBFloat16)
                                     : std::nullopt);
      WeightGradStore store;
      for (int mb = 0; mb < 2; ++mb) {
        const auto x = torch::randn({2, 3, 5}, torch::requires_grad());
        torch::Tensor y;
        {
          AutocastScope scope(c10::kBFloat16);
          y = pipe(x);
        }
        outputs.push_back(y);
        std::optional<DeferWeightGrads> deferred;
        if (defer) deferred.emplace(&store);
        y.backward(torch::ones_like(y));
      }
      store.run();
      grads.push_back(grads_of(*pipe));
    }
    for (size_t mb = 0; mb < 2; ++mb) EXPECT_TRUE(torch::equal(outputs[mb], outputs[mb + 2]));
    for (const auto& [name, grad] : grads[0]) {
      EXPECT_TRUE(torch::equal(grad, grads[1].at(name))) << name << " defer " << defer;
    }
  }
}

TEST(PipeLinear, InitialisesLikeTorchLinear) {
  PipeLinear pipe(64, 16);
  const double bound = 1.0 / 8.0;
  EXPECT_LE(pipe->weight.abs().max().item<double>(), bound);
  EXPECT_GT(pipe->weight.abs().max().item<double>(), 0.9 * bound);
  EXPECT_LE(pipe->bias.abs().max().item<double>(), bound);
}

TEST(PipeLinear, DeferredWeightGradsArriveOnlyWhenRun) {
  torch::manual_seed(2);
  torch::nn::Sequential net(PipeLinear(6, 12), torch::nn::Functional(torch::gelu, "none"),
                            PipeLinear(12, 6),
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
  auto x = torch::randn({4, 6});
  auto grad = torch::randn({4, 6});

  auto x_ref = x.clone().requires_grad_(true);
  net->forward(x_ref).backward(grad);
  auto reference = grads_of(*net);
  net->zero_grad();

  auto x_split = x.clone().requires_grad_(true);
  auto out = net->forward(x_split);
  WeightGradStore store;
  {
    DeferWeightGrads defer(&store);
    out.backward(grad);  // I
  }
  expect_close(x_split.grad(), x_ref.grad());
  // One closure per PipeLinear, each holding its input and output gradient.
  EXPECT_EQ(store.size(), 2);
  EXPECT_EQ(store.stash_bytes(), (4 * 6 + 4 * 12 + 4 * 12 + 4 * 6) * 4);
  for (const auto& item : net->named_parameters()) {
    const bool linear = item.key().rfind("0.", 0) == 0 || item.key().rfind("2.", 0) == 0;
    const auto& g = item.value().grad();
    if (linear) {
      EXPECT_TRUE(!g.defined() || g.abs().max().item<double>() == 0) << item.key();
    } else {
      // LayerNorm has no deferral: its weight gradient is computed during I.
      expect_close(g, reference[item.key()]);
    }
  }

  store.run();  // W
  EXPECT_TRUE(store.empty());
  EXPECT_EQ(store.stash_bytes(), 0);
  for (const auto& item : grads_of(*net)) expect_close(item.second, reference[item.first]);
}

// A weight given as rows of a parameter (as cross-attention splits its packed projection into
// the query's rows and the key-value's): W adds each product to those rows; a weight computed
// from the parameter (no rows of it) gets its gradient in I, through autograd.
TEST(PipeLinear, DeferredGradsOfASliceGoToItsRows) {
  torch::manual_seed(3);
  const auto packed = torch::randn({9, 4}).requires_grad_(true);  // three 3x4 projections
  const auto bias = torch::randn({9}).requires_grad_(true);
  const auto scaled = torch::randn({3, 4}).requires_grad_(true);
  const auto x = torch::randn({5, 4});
  const auto grad = torch::randn({5, 3});
  const auto forward = [&] {
    const auto parts = packed.split({3, 6});
    const auto biases = bias.split({3, 6});
    const auto kv = pipe_linear(x, parts[1], biases[1]);  // rows 3-8
    return pipe_linear(x, parts[0], biases[0]) + kv.narrow(1, 0, 3) + kv.narrow(1, 3, 3) +
           pipe_linear(x, scaled * 2, torch::Tensor());
  };
  forward().backward(grad);
  const auto want_packed = packed.grad().clone(), want_bias = bias.grad().clone();
  const auto want_scaled = scaled.grad().clone();
  packed.mutable_grad().reset();
  bias.mutable_grad().reset();
  scaled.mutable_grad().reset();

  WeightGradStore store;
  const auto out = forward();
  {
    DeferWeightGrads defer(&store);
    out.backward(grad);  // I
  }
  EXPECT_EQ(store.size(), 2);  // the two slices; the computed weight's went through autograd
  expect_close(scaled.grad(), want_scaled);
  // autograd's split() backward may have filled the parameters' gradients with zeros.
  EXPECT_TRUE(!packed.grad().defined() || packed.grad().abs().max().item<double>() == 0);
  store.run();  // W
  expect_close(packed.grad(), want_packed, 1e-5);
  expect_close(bias.grad(), want_bias, 1e-5);
}

TEST(PipeLinear, DeferredGradsAccumulateOverMicrobatches) {
  torch::manual_seed(3);
  PipeLinear layer(3, 2);
  auto a = torch::randn({5, 3}), b = torch::randn({5, 3});
  layer(a).sum().backward();
  layer(b).sum().backward();
  auto expected_weight = layer->weight.grad().clone();
  auto expected_bias = layer->bias.grad().clone();
  layer->zero_grad();

  WeightGradStore first, second;
  auto out_a = layer(a), out_b = layer(b);
  {
    DeferWeightGrads defer(&first);
    out_a.sum().backward();
  }
  {
    DeferWeightGrads defer(&second);
    out_b.sum().backward();
  }
  second.run();  // W may run in any order
  first.run();
  expect_close(layer->weight.grad(), expected_weight);
  expect_close(layer->bias.grad(), expected_bias);
}

TEST(PipeLinear, GptBlocksSplitBackwardMatchesFullBackward) {
  ModelOptions options;
  options.layers = 2;
  options.d_model = 32;
  options.seq_len = 8;
  torch::nn::Sequential stack;
  for (int i = 1; i <= 2; ++i) stack->push_back(make_layer(options, i));
  auto x = torch::randn({2, 8, 32});
  auto grad = torch::randn({2, 8, 32});

  auto x_full = x.clone().requires_grad_(true);
  stack->forward(x_full).backward(grad);
  auto reference = grads_of(*stack);
  stack->zero_grad();

  auto x_split = x.clone().requires_grad_(true);
  auto out = stack->forward(x_split);
  WeightGradStore store;
  {
    DeferWeightGrads defer(&store);
    out.backward(grad);
  }
  EXPECT_EQ(store.size(), 2 * 4);  // qkv, proj, fc1, fc2 per block
  expect_close(x_split.grad(), x_full.grad(), 1e-5);
  store.run();
  for (const auto& item : grads_of(*stack)) expect_close(item.second, reference[item.first], 1e-5);
}

TEST(DeferWeightGrads, IsNotReentrantAndClearsOnExit) {
  WeightGradStore a, b;
  {
    DeferWeightGrads defer(&a);
    EXPECT_EQ(active_weight_grad_store(), &a);
    EXPECT_THROW(DeferWeightGrads again(&b), InternalError);
    EXPECT_EQ(active_weight_grad_store(), &a);
  }
  EXPECT_EQ(active_weight_grad_store(), nullptr);
}

// Ranks that run as threads of one process each defer into their own store: a guard is seen
// only by the thread that holds it.
TEST(DeferWeightGrads, IsPerThread) {
  WeightGradStore mine, theirs;
  DeferWeightGrads defer(&mine);
  std::thread other([&] {
    EXPECT_EQ(active_weight_grad_store(), nullptr);
    DeferWeightGrads their_defer(&theirs);  // not a reentry: another thread
    EXPECT_EQ(active_weight_grad_store(), &theirs);
  });
  other.join();
  EXPECT_EQ(active_weight_grad_store(), &mine);
}

TEST(WeightGradStore, RunsClosuresInOrderOnce) {
  WeightGradStore store;
  std::vector<int> calls;
  store.push([&] { calls.push_back(1); }, 10);
  store.push([&] { calls.push_back(2); }, 5);
  EXPECT_EQ(store.stash_bytes(), 15);
  store.run();
  store.run();
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace pptrain
