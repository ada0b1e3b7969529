#include "pptrain/train/pipemare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pptrain {
namespace {

TEST(PipeMare, LearningRateStartsDividedByTheDelayAndAnnealsToTheBaseRate) {
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(/*delay=*/4, /*step=*/0, /*warmup_steps=*/10), 0.25);
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(4, 5, 10), 0.5);  // 4^-(1/2)
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(4, 10, 10), 1.0);
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(4, 50, 10), 1.0);
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(1, 0, 10), 1.0);  // no delay to make up for
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(0, 0, 10), 1.0);
  EXPECT_DOUBLE_EQ(pipemare_lr_scale(4, 0, 0), 1.0);  // no warm-up
}

// One linear layer as a stage; its weights set to `value`.
Stage constant_stage(float value) {
  ModelOptions model;
  model.kind = "mlp";
  model.layers = 1;
  model.d_model = 2;
  Stage stage = make_stage(model, 0, {0, 0});
  torch::NoGradGuard no_grad;
  for (auto& p : stage.parameters()) p.fill_(value);
  return stage;
}

TEST(PipeMare, CorrectionMovesTheBackwardsWeightsBackAlongTheRecentSteps) {
  Stage live = constant_stage(1);
  PipeMareOptions options;
  options.decay = 0.25;
  PipeMareStage fixes(
      &live, [] { return constant_stage(0); }, /*delay=*/2, options);
  // Before any step delta is 0: the corrected weights are the newest ones.
  EXPECT_TRUE(fixes.backward_weights(live, 1).parameters()[0].equal(live.parameters()[0]));
  fixes.gradients_to(live);
  // A step of +0.5: delta = (1 - g) * 0.5 with g = 0.25^(1/2) = 0.5.
  fixes.before_step();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : live.parameters()) p.add_(0.5);
  }
  fixes.after_step();
  Stage& corrected = fixes.backward_weights(live, /*lag=*/2);
  EXPECT_NEAR(corrected.parameters()[0].flatten()[0].item<float>(), 1.5 - 2 * 0.25, 1e-6);
  EXPECT_FLOAT_EQ(live.parameters()[0].flatten()[0].item<float>(), 1.5);  // untouched
  // Its gradients join the newest weights'.
  corrected.forward(torch::tensor({{1.0f, -2.0f}})).square().sum().backward();
  for (auto& p : live.parameters()) p.mutable_grad() = torch::ones_like(p);
  const auto params = corrected.parameters();
  std::vector<torch::Tensor> computed;
  for (const auto& p : params) computed.push_back(p.grad().clone());
  fixes.gradients_to(live);
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_TRUE(live.parameters()[p].grad().equal(computed[p] + 1));
  }
  double total = 0;
  for (const auto& g : computed) total += g.abs().sum().item<double>();
  EXPECT_GT(total, 0);
  for (const auto& p : corrected.parameters()) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0);
}

TEST(PipeMare, OffMeansTheNewestWeightsAndTheBaseRate) {
  Stage live = constant_stage(1);
  PipeMareOptions options;
  options.correction = false;
  options.lr_reschedule = false;
  PipeMareStage fixes(
      &live, [] { return constant_stage(0); }, /*delay=*/3, options);
  fixes.before_step();
  fixes.after_step();
  EXPECT_EQ(&fixes.backward_weights(live, 2), &live);
  EXPECT_DOUBLE_EQ(fixes.lr_scale(0), 1.0);
}

}  // namespace
}  // namespace pptrain
