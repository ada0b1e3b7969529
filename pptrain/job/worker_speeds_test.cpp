#include "pptrain/job/worker_speeds.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "pptrain/job/testing.h"
#include "pptrain/models/model.h"

namespace pptrain {
namespace {

// gpt of 8 blocks (10 layers) on 2 ranks of 1F1B, 4 microbatches of 2 samples.
TrainOptions two_ranks() {
  return testing::small_gpt(/*blocks=*/8, /*seq_len=*/8, /*pp=*/2);
}

// The model's 10 layers, each 3 ms (F + I + W) and no bytes but `parameter_bytes`.
Profile layers_of(const TrainOptions& options, double parameter_bytes = 0) {
  Profile profile;
  profile.source = "<test>";
  profile.microbatch_size = 2;
  for (int l = 0; l < num_layers(options.model); ++l) {
    LayerProfile layer;
    layer.name = layer_name(options.model, l);
    layer.forward_ms = layer.backward_input_ms = layer.backward_weight_ms = 1;
    layer.parameter_bytes = parameter_bytes;
    profile.layers.push_back(layer);
  }
  return profile;
}

// Two workers, speed 1, with these memory limits (0: none).
WorkersProfile workers_with(double limit0, double limit1) {
  WorkersProfile workers;
  workers.workers = {{0, 1, limit0, 0}, {1, 1, limit1, 0}};
  return workers;
}

Replan at_speeds(std::vector<double> speeds) {
  Replan replan;
  replan.speeds = std::move(speeds);
  return replan;
}

// The fastest cut for equal ranks, 0-4,5-9, puts layer 4's 100 MB of parameters (with their
// gradients and optimizer state) on rank 0, played by worker 1 (--placement 1,0), whose limit is
// 50 MB: the cut taken is the fastest that fits, 0-3,4-9, on the same workers.
TEST(CutForReplan, AFasterCutOverARanksLimitIsNotTaken) {
  TrainOptions options = two_ranks();
  options.placement = "1,0";
  const TrainingPlan uniform = plan_training(options, /*may_profile=*/false);
  Profile profile = layers_of(options);
  profile.layers[4].parameter_bytes = 1e8;

  Replan unlimited = at_speeds({1, 1});
  cut_for_replan(options, uniform, profile, workers_with(0, 0), {1, 0}, unlimited);
  EXPECT_EQ(unlimited.ranges, (std::vector<LayerRange>{{0, 4}, {5, 9}}));
  EXPECT_TRUE(unlimited.kept.empty()) << unlimited.kept;

  Replan limited = at_speeds({1, 1});
  cut_for_replan(options, uniform, profile, workers_with(0, 5e7), {1, 0}, limited);
  EXPECT_TRUE(limited.kept.empty()) << limited.kept;
  EXPECT_EQ(limited.ranges, (std::vector<LayerRange>{{0, 3}, {4, 9}}));
  EXPECT_TRUE(limited.placement.empty());                 // the user's placement stays
  EXPECT_DOUBLE_EQ(limited.after_s, 6 * 3.0 * 4 / 1000);  // 6 layers of 3 ms, 4 microbatches
}

// Worker 0 falls to a third of worker 1's speed while it plays rank 0, whose first layer is the
// heaviest (15 ms): kept there it takes at least 45 ms a microbatch; with rank 0 played by worker
// 1 instead (layers 0-6, 33 ms) and worker 0 on the last 3 layers (27 ms), the slowest stage
// takes 33 ms. The ranks swap workers.
TEST(CutForReplan, SwappingRanksBetweenWorkersWinsWhenItIsFaster) {
  const TrainOptions options = two_ranks();
  const TrainingPlan uniform = plan_training(options, /*may_profile=*/false);
  Profile profile = layers_of(options);
  profile.layers[0].forward_ms = 13;
  Replan replan = at_speeds({1.0 / 3, 1});
  cut_for_replan(options, uniform, profile, workers_with(0, 0), {}, replan);
  EXPECT_TRUE(replan.kept.empty()) << replan.kept;
  EXPECT_EQ(replan.placement, (std::vector<int>{1, 0}));
  EXPECT_EQ(replan.ranges, (std::vector<LayerRange>{{0, 6}, {7, 9}}));
  EXPECT_NEAR(replan.after_s, 33 * 4 / 1000.0, 1e-12);  // stage 0: 15 + 6 x 3 ms

  // At equal speeds the swap gains nothing: the workers stay.
  Replan equal = at_speeds({1, 1});
  cut_for_replan(options, uniform, profile, workers_with(0, 0), {}, equal);
  EXPECT_TRUE(equal.placement.empty());
}

// No cut fits when every worker's limit is below one layer's bytes: the cut stays, and why is
// the planner's one line.
TEST(CutForReplan, NoCutThatFitsKeepsTheCutAndSaysWhy) {
  const TrainOptions options = two_ranks();
  const TrainingPlan uniform = plan_training(options, /*may_profile=*/false);
  Replan replan = at_speeds({1, 0.5});
  cut_for_replan(options, uniform, layers_of(options, 1e8), workers_with(1e6, 1e6), {}, replan);
  EXPECT_TRUE(replan.ranges.empty());
  EXPECT_EQ(replan.kept.rfind("no cut of the model's 10 layers into 2 stages fits", 0), 0u)
      << replan.kept;
  EXPECT_EQ(replan.kept.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace pptrain
