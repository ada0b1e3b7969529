#include "pptrain/train/loss_scale.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// GradScaler's rule: an overflow halves the scale and starts the count again; growth_interval
// finite steps in a row double it.
TEST(LossScale, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScale scale(LossScaleOptions{1024, 2, 0.5, 3});
  EXPECT_EQ(scale.scale(), 1024);
  EXPECT_TRUE(scale.update(true));
  EXPECT_TRUE(scale.update(true));
  EXPECT_FALSE(scale.update(false));  // skipped
  EXPECT_EQ(scale.scale(), 512);
  EXPECT_EQ(scale.growth_tracker(), 0);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(scale.update(true));
  EXPECT_EQ(scale.scale(), 512);
  EXPECT_TRUE(scale.update(true));
  EXPECT_EQ(scale.scale(), 1024);
  EXPECT_EQ(scale.skipped_steps(), 1);
}

TEST(LossScale, ItsStateGoesThroughACheckpoint) {
  LossScale scale(LossScaleOptions{1024, 2, 0.5, 3});
  scale.update(false);
  scale.update(true);
  NamedTensors state;
  scale.save_state(state);
  LossScale back(LossScaleOptions{1024, 2, 0.5, 3});
  back.load_state(state, "--resume");
  EXPECT_EQ(back.scale(), 512);
  EXPECT_EQ(back.growth_tracker(), 1);
  EXPECT_EQ(back.skipped_steps(), 1);
  state.erase("loss_scale/scale");
  EXPECT_THROW(back.load_state(state, "--resume"), UserError);
}

TEST(LossScale, UnscalingDividesEveryGradientExactly) {
  torch::Tensor a = torch::ones({3}).requires_grad_(), b = torch::ones({2}).requires_grad_();
  a.mutable_grad() = torch::tensor({1024.0f, 3072.0f, -512.0f});
  unscale_gradients({a, b}, 1024);  // b has no gradient: left as it is
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({1.0f, 3.0f, -0.5f})));
  EXPECT_FALSE(b.grad().defined());
}

}  // namespace
}  // namespace pptrain
