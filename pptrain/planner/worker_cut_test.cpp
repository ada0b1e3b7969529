#include "pptrain/planner/worker_cut.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// 8 equal layers; the later ones keep more for the backward.
Profile profile_of_8() {
  Profile p;
  p.source = "<test>";
  for (int l = 0; l < 8; ++l) {
    LayerProfile layer;
    layer.name = "layer" + std::to_string(l);
    layer.forward_ms = 1;
    layer.backward_input_ms = 1;
    layer.backward_weight_ms = 1;
    layer.activation_bytes = 1000;
    layer.stash_bytes = 4000 + 1000 * l;
    layer.parameter_bytes = 5000;
    p.layers.push_back(layer);
  }
  return p;
}

// 1F1B on P ranks, M = 4, rank 0 fast and rank 1 at `slow` of its speed.
WorkerCutRequest request_of(double slow, const std::vector<double>& limits) {
  WorkerCutRequest r;
  r.profile = profile_of_8();
  r.planner.workers = 2;
  r.planner.batch_size = 4;
  r.planner.microbatches = {4};
  r.planner.profile_microbatch_size = 1;
  r.planner.rank_memory_limits = limits;
  r.shape.schedule = "1f1b";
  r.shape.microbatches = 4;
  r.stage_speeds = {1, slow};
  PartitionOptions time;
  time.stages = 2;
  time.stage_speeds = r.stage_speeds;
  for (const StagePlan& s : make_partition(r.profile, time).stages) {
    r.time_cut.emplace_back(s.first_layer, s.last_layer);
  }
  return r;
}

TEST(WorkerCut, EveryCutIsEveryComposition) {
  EXPECT_EQ(every_cut(10, 4, kMaxWorkerCuts).size(), 84u);  // C(9, 3)
  EXPECT_EQ(every_cut(3, 3, kMaxWorkerCuts),
            (std::vector<std::vector<LayerRange>>{{{0, 0}, {1, 1}, {2, 2}}}));
  EXPECT_EQ(every_cut(4, 2, kMaxWorkerCuts).size(), 3u);
  EXPECT_TRUE(every_cut(64, 8, kMaxWorkerCuts).empty());  // C(63, 7): too many
  for (const auto& cut : every_cut(9, 3, kMaxWorkerCuts)) {
    EXPECT_EQ(cut.front().first, 0);
    EXPECT_EQ(cut.back().second, 8);
    for (size_t s = 1; s < cut.size(); ++s) EXPECT_EQ(cut[s].first, cut[s - 1].second + 1);
  }
}

TEST(WorkerCut, WithoutLimitsTheTimeCutStays) {
  const WorkerCutRequest r = request_of(0.5, {0, 0});
  const WorkerCut cut = fit_cut_to_workers(r);
  EXPECT_EQ(cut.stage_layers, r.time_cut);
  EXPECT_EQ(cut.cuts_tried, 1);
  EXPECT_EQ(cut.peak_bytes.size(), 2u);
}

// The brute force the choice must match: over every cut, the fastest slowest stage among those
// whose peaks (evaluate(), the planner's) fit every rank's limit less the margin.
TEST(WorkerCut, FastestCutThatFitsAsEvaluateSaysIt) {
  for (double slow : {1.0, 0.5, 0.3}) {
    WorkerCutRequest r = request_of(slow, {0, 0});
    const std::vector<std::vector<LayerRange>> cuts = every_cut(8, 2, kMaxWorkerCuts);
    std::vector<std::vector<double>> peaks;
    for (const auto& cut : cuts) {
      Candidate c = r.shape;
      c.stage_layers = cut;
      peaks.push_back(evaluate(r.profile, r.planner, c).peak_bytes);
    }
    EXPECT_EQ(cut_peak_bytes(r.profile, r.planner, r.shape, cuts), peaks);
    // Rank 0, the fast one, limited to what each cut needs in turn.
    for (const auto& limit_of : peaks) {
      r.planner.rank_memory_limits = {limit_of[0] / (1 - r.planner.memory_margin), 0};
      double best = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < cuts.size(); ++i) {
        if (!fits_memory_limits(r.planner, peaks[i])) continue;
        best = std::min(best, slowest_stage_ms(r.profile, cuts[i], r.stage_speeds));
      }
      const WorkerCut cut = fit_cut_to_workers(r);
      EXPECT_DOUBLE_EQ(cut.slowest_stage_ms, best) << "slow " << slow;
      EXPECT_TRUE(fits_memory_limits(r.planner, cut.peak_bytes));
    }
  }
}

TEST(WorkerCut, ASmallLimitMovesLayersOffItsRank) {
  WorkerCutRequest r = request_of(0.5, {0, 0});
  const WorkerCut free = fit_cut_to_workers(r);
  ASSERT_GT(free.stage_layers[0].second, 3);  // the fast rank 0 takes more than half
  r.planner.rank_memory_limits = {free.peak_bytes[0] * 0.8, 0};
  const WorkerCut held = fit_cut_to_workers(r);
  EXPECT_LT(held.stage_layers[0].second, free.stage_layers[0].second);
  EXPECT_GT(held.slowest_stage_ms, free.slowest_stage_ms);
  EXPECT_LE(held.peak_bytes[0], free.peak_bytes[0] * 0.8 * 0.95);
}

TEST(WorkerCut, NoCutFitsNamesTheRankAndTheSmallestLimit) {
  WorkerCutRequest r = request_of(1, {0, 0});
  const std::vector<std::vector<LayerRange>> cuts = every_cut(8, 2, kMaxWorkerCuts);
  double smallest = std::numeric_limits<double>::infinity();
  for (const auto& peaks : cut_peak_bytes(r.profile, r.planner, r.shape, cuts)) {
    smallest = std::min(smallest, peaks[1]);
  }
  r.planner.rank_memory_limits = {0, smallest / 2};
  try {
    fit_cut_to_workers(r);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("fits rank 1's memory limit"), std::string::npos) << message;
    const std::string bytes = std::to_string(static_cast<long long>(std::ceil(smallest / 0.95)));
    EXPECT_NE(message.find("smallest limit that works on rank 1 is "), std::string::npos)
        << message;
    EXPECT_NE(message.find(bytes + " bytes"), std::string::npos) << message << " " << bytes;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  // That limit works.
  r.planner.rank_memory_limits = {0, std::ceil(smallest / 0.95)};
  EXPECT_NO_THROW(fit_cut_to_workers(r));
  // Both ranks too small: each is named with what it needs in the closest cut.
  r.planner.rank_memory_limits = {1000, 1000};
  try {
    fit_cut_to_workers(r);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("the closest, stage layers"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 "), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1 "), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pptrain
