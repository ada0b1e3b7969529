#include "pptrain/models/autograd_split.h"

#include <gtest/gtest.h>

#include <vector>

namespace pptrain {
namespace {

// Passes its input through; counts how often autograd runs its backward.
struct CountedIdentity : torch::autograd::Function<CountedIdentity> {
  static inline int backwards = 0;
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    ++backwards;
    return grads;
  }
};

// A stage of what a split must get right: a linear layer used twice (its weight reached from two
// places on the input's path), a norm, a counted node on the input's path between them, and a
// second output that depends on a parameter alone.
struct Stage {
  torch::nn::Linear shared{torch::nn::LinearOptions(6, 6)};
  torch::nn::LayerNorm norm{torch::nn::LayerNormOptions({6})};
  torch::nn::Linear out{torch::nn::LinearOptions(6, 3)};

  Stage() {
    torch::manual_seed(3);
    for (auto& p : parameters()) p.data().uniform_(-0.5, 0.5);
  }
  std::vector<torch::Tensor> parameters() {
    std::vector<torch::Tensor> all;
    for (const auto& part : {shared->parameters(), norm->parameters(), out->parameters()}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }
  // x: [4, 6] -> {[4, 3], [] }
  std::vector<torch::Tensor> operator()(const torch::Tensor& x) {
    torch::Tensor h = torch::tanh(shared(x));
    h = CountedIdentity::apply(h);
    h = norm(shared(h) + h);
    return {out(h), (out->bias * out->bias).sum()};
  }
  void zero_grad() {
    for (auto& p : parameters()) p.mutable_grad() = torch::Tensor();
  }
};

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> grads;
  for (const auto& t : tensors) grads.push_back(t.grad().defined() ? t.grad().clone() : t.grad());
  return grads;
}

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    ASSERT_TRUE(got[i].defined());
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-7)) << got[i] << "\n" << want[i];
  }
}

TEST(AutogradSplit, IAndWEqualOneBackwardAndRunTheInputPathOnce) {
  Stage stage;
  const torch::Tensor x0 = torch::randn({4, 6});
  const std::vector<torch::Tensor> output_grads = {torch::randn({4, 3}), torch::tensor(0.7)};

  // One fused backward.
  torch::Tensor x = x0.clone().requires_grad_(true);
  torch::autograd::backward(stage(x), output_grads);
  const torch::Tensor want_input = x.grad().clone();
  const std::vector<torch::Tensor> want_params = grads_of(stage.parameters());
  stage.zero_grad();

  CountedIdentity::backwards = 0;
  torch::Tensor split_x = x0.clone().requires_grad_(true);
  WeightPass weight;
  const std::vector<torch::Tensor> input_grads =
      input_backward(stage(split_x), output_grads, {split_x}, weight);
  ASSERT_EQ(input_grads.size(), 1u);
  EXPECT_TRUE(torch::allclose(input_grads[0], want_input, 1e-6, 1e-7));
  EXPECT_FALSE(split_x.grad().defined()) << "I accumulates nothing";
  for (const auto& p : stage.parameters()) EXPECT_FALSE(p.grad().defined()) << "I made a W";
  EXPECT_EQ(CountedIdentity::backwards, 1);
  ASSERT_FALSE(weight.empty());

  run_weight_pass(weight, stage.parameters());
  EXPECT_TRUE(weight.empty());
  expect_close(grads_of(stage.parameters()), want_params);
  // W ran from the kept gradients: the input's path was not run again.
  EXPECT_EQ(CountedIdentity::backwards, 1);
}

TEST(AutogradSplit, WithoutInputsWIsTheWholeBackward) {
  Stage stage;
  const torch::Tensor x = torch::randn({4, 6});  // data: the first stage
  const std::vector<torch::Tensor> output_grads = {torch::randn({4, 3}), torch::tensor(1.0)};
  torch::autograd::backward(stage(x), output_grads);
  const std::vector<torch::Tensor> want = grads_of(stage.parameters());
  stage.zero_grad();

  WeightPass weight;
  EXPECT_TRUE(input_backward(stage(x), output_grads, {}, weight).empty());
  for (const auto& p : stage.parameters()) EXPECT_FALSE(p.grad().defined());
  run_weight_pass(weight, stage.parameters());
  expect_close(grads_of(stage.parameters()), want);
}

TEST(AutogradSplit, AnUnusedInputGetsNoGradientAndALossGetsOnes) {
  torch::nn::Linear layer(3, 1);
  const torch::Tensor used = torch::randn({2, 3}).requires_grad_(true);
  const torch::Tensor unused = torch::randn({2, 3}).requires_grad_(true);
  WeightPass weight;
  const auto grads = input_backward({layer(used).sum()}, {}, {used, unused}, weight);
  ASSERT_EQ(grads.size(), 2u);
  // d sum(x W^T + b) / dx = W in each row.
  EXPECT_TRUE(torch::allclose(grads[0], layer->weight.expand({2, 3})));
  EXPECT_FALSE(grads[1].defined());
  run_weight_pass(weight, layer->parameters());
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), used.detach().sum(0, true)));
  EXPECT_TRUE(torch::allclose(layer->bias.grad(), torch::full({1}, 2.0)));
}

}  // namespace
}  // namespace pptrain
