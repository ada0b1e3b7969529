#include "pptrain/sim/metrics.h"

#include <gtest/gtest.h>

namespace pptrain {
namespace {

TEST(TimelineStats, BubbleFollowsTheZeroBubbleDefinition) {
  // Two ranks; rank 1 starts one unit late and ends one unit late: span 3 on each rank.
  Timeline t{"t",
             2,
             {{0, Action::make(Op::F, 0, 0), 0, 1},
              {0, Action::make(Op::B, 0, 0), 2, 3},
              {1, Action::make(Op::F, 1, 0), 1, 2},
              {1, Action::make(Op::B, 1, 0), 2, 4},
              {1, Action::make(Op::SEND_B, 1, 0), 4, 4}}};
  TimelineStats s = timeline_stats(t);
  EXPECT_DOUBLE_EQ(s.makespan, 4);
  EXPECT_DOUBLE_EQ(s.cost, 3);
  EXPECT_DOUBLE_EQ(s.busy[0], 2);
  EXPECT_DOUBLE_EQ(s.busy[1], 3);
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 1.0 - 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.idle[0], 2);
}

TEST(TimelineStats, AReductionIsNeitherBusyNorIdleUnderComputeAndIdleAfterIt) {
  // Rank 0 computes 0..4; its all-reduce runs 2..6, under the compute until 4, alone after it.
  Timeline t{"t",
             1,
             {{0, Action::make(Op::F, 0, 0), 0, 1},
              {0, Action::make(Op::B, 0, 0), 1, 4},
              {0, Action::make(Op::REDUCE_GRAD, 0, -1), 2, 6}}};
  TimelineStats s = timeline_stats(t);
  EXPECT_DOUBLE_EQ(s.busy[0], 4);  // compute only, counted once
  EXPECT_DOUBLE_EQ(s.makespan, 6);
  EXPECT_DOUBLE_EQ(s.cost, 6);
  EXPECT_DOUBLE_EQ(s.idle[0], 2);  // the exposed tail 4..6
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 1.0 - 4.0 / 6.0);
}

}  // namespace
}  // namespace pptrain
