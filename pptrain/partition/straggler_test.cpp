#include "pptrain/partition/straggler.h"

#include <gtest/gtest.h>

namespace pptrain {
namespace {

// 8 layers of 3 ms each (F + I + W), cut 4 + 4 onto two ranks.
Profile eight_layers() {
  Profile p;
  for (int i = 0; i < 8; ++i) p.layers.push_back({"l" + std::to_string(i), 1, 1, 1, 0, 0, 0});
  return p;
}

const std::vector<LayerRange> kHalves = {{0, 3}, {4, 7}};

// The `time` partitioner's cut for the speeds measured, on the same ranks.
Cutter time_cut(const Profile& profile, int microbatches) {
  return [profile, microbatches](Replan& replan) {
    PartitionOptions options;
    options.method = "time";
    options.stages = static_cast<int>(replan.speeds.size());
    options.stage_speeds = replan.speeds;
    const Partition partition = make_partition(profile, options);
    for (const StagePlan& stage : partition.stages) {
      replan.ranges.emplace_back(stage.first_layer, stage.last_layer);
    }
    replan.after_s = partition.time_per_minibatch_s * microbatches;
  };
}

TEST(StragglerWatch, ASlowedRankGetsFewerLayersAfterSeveralSteps) {
  StragglerWatch watch(eight_layers(), 10, kHalves, {}, time_cut(eight_layers(), 10));
  // 2 settling steps (ignored, however slow), 3 baseline steps, then steady.
  for (int step = 0; step < 8; ++step) {
    EXPECT_FALSE(watch.observe({step < 2 ? 5.0 : 1.0, 1.0})) << step;
  }
  // Rank 1 at a third of its speed: nothing for two steps, a new cut at the third.
  EXPECT_FALSE(watch.observe({1.0, 3.0}));
  EXPECT_FALSE(watch.observe({1.0, 3.0}));
  const auto replan = watch.observe({1.0, 3.0});
  ASSERT_TRUE(replan);
  EXPECT_EQ(replan->rank, 1);
  EXPECT_DOUBLE_EQ(replan->slowdown, 3.0);
  EXPECT_EQ(replan->speeds, (std::vector<double>{1.0, 1.0 / 3}));
  EXPECT_EQ(replan->ranges, (std::vector<LayerRange>{{0, 5}, {6, 7}}));
  // Rank 1's 4 layers x 3 ms x 10 microbatches at a third of the speed, then rank 0's 6 layers.
  EXPECT_NEAR(replan->before_s, 0.36, 1e-12);
  EXPECT_NEAR(replan->after_s, 0.18, 1e-12);
  EXPECT_EQ(describe_replan(*replan, kHalves),
            "rank 1 computes 3.00x its pace at the cut; stage layers 0-3,4-7 -> 0-5,6-7 (slowest "
            "stage 0.360 s -> 0.180 s per step, predicted)");
}

TEST(StragglerWatch, NoiseAndSmallChangesDoNotMoveLayers) {
  StragglerWatch watch(eight_layers(), 10, kHalves, {}, time_cut(eight_layers(), 10));
  for (int step = 0; step < 5; ++step) watch.observe({1.0, 1.0});
  // Within the band, or out of it for fewer steps in a row than it takes: nothing.
  for (int step = 0; step < 20; ++step) {
    const double noise = step % 3 == 0 ? 2.0 : 1.2;
    EXPECT_FALSE(watch.observe({1.0, noise})) << step;
  }
}

TEST(StragglerWatch, ACutMadeForASlowRankMovesBackWhenItRecovers) {
  // The cut 0-5,6-7 was made for rank 1 at a third of the speed; rank 1 gets its full speed back.
  StragglerWatch watch(eight_layers(), 10, {{0, 5}, {6, 7}}, {1.0, 1.0 / 3},
                       time_cut(eight_layers(), 10));
  for (int step = 0; step < 5; ++step) watch.observe({1.8, 1.8});
  std::optional<Replan> replan;
  for (int step = 0; step < 3 && !replan; ++step) replan = watch.observe({1.8, 0.6});
  ASSERT_TRUE(replan);
  EXPECT_EQ(replan->rank, 1);
  EXPECT_EQ(replan->ranges, kHalves);
  EXPECT_NEAR(replan->speeds[1], 1.0, 1e-12);
}

// A cut that keeps the ranges but moves the ranks to other workers is a move too, and its line
// names the placement.
TEST(StragglerWatch, ANewPlacementOfTheSameCutIsAMove) {
  StragglerWatch watch(eight_layers(), 10, kHalves, {}, [](Replan& replan) {
    replan.ranges = kHalves;
    replan.placement = {1, 0};
    replan.after_s = 0.12;
  });
  for (int step = 0; step < 5; ++step) watch.observe({1.0, 1.0});
  std::optional<Replan> replan;
  for (int step = 0; step < 3 && !replan; ++step) replan = watch.observe({1.0, 3.0});
  ASSERT_TRUE(replan);
  EXPECT_EQ(describe_replan(*replan, kHalves),
            "rank 1 computes 3.00x its pace at the cut; stage layers 0-3,4-7 -> 0-3,4-7, "
            "placement 1,0 (slowest stage 0.360 s -> 0.120 s per step, predicted)");
}

// When no cut can be made the watch says so once and takes the paces now as the cut's: the same
// slowness does not ask again, a further change does.
TEST(StragglerWatch, NoCutToMakeIsSaidOnceAndTheNewPaceKept) {
  int asked = 0;
  StragglerWatch watch(eight_layers(), 10, kHalves, {}, [&asked](Replan& replan) {
    ++asked;
    replan.kept = "no cut fits";
  });
  for (int step = 0; step < 5; ++step) watch.observe({1.0, 1.0});
  std::optional<Replan> replan;
  for (int step = 0; step < 3 && !replan; ++step) replan = watch.observe({1.0, 3.0});
  ASSERT_TRUE(replan);
  EXPECT_EQ(describe_replan(*replan, kHalves),
            "rank 1 computes 3.00x its pace at the cut; stage layers 0-3,4-7 stay: no cut fits");
  for (int step = 0; step < 10; ++step) EXPECT_FALSE(watch.observe({1.0, 3.0})) << step;
  EXPECT_EQ(asked, 1);
  // Slower again, by 2x: the speed is measured from the pace the watch took.
  for (int step = 0; step < 3 && asked == 1; ++step) replan = watch.observe({1.0, 6.0});
  EXPECT_EQ(asked, 2);
  EXPECT_NEAR(replan->speeds[1], 1.0 / 6, 1e-12);
}

}  // namespace
}  // namespace pptrain
