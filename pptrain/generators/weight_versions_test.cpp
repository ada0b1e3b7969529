#include "pptrain/schedule/weight_versions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"

namespace pptrain {
namespace {

// Replays one rank's 1F1B list of a P-stage pipeline (stage = rank) under `rule`, as the
// runtime does: a step after the backwards the rule names, and with more than one version kept,
// versions needed by a later action kept as snapshots (with one, every action must find its
// version live). Returns the most distinct versions alive at once (those still needed, and the
// live one), and checks that every version an action asks for is still alive or is the live one.
int replay_most_versions(const VersionRule& rule, const Schedule& schedule, int stage) {
  const bool snapshots = rule.versions_kept(stage) > 1;
  int live = 0;
  std::set<int> held;  // versions taken by a forward and still needed
  size_t most = 1;
  for (const Action& a : schedule.actions[schedule.stage_to_rank[stage]]) {
    if ((a.op != Op::F && a.op != Op::B) || a.stage != stage) continue;
    const int v = a.op == Op::F ? rule.forward_version(a.microbatch, stage)
                                : rule.backward_version(a.microbatch, stage);
    EXPECT_TRUE(v == live || held.count(v))
        << to_string(a) << " asks for version " << v << ", live is " << live;
    if (snapshots) held.insert(v);
    if (a.op == Op::B && rule.steps_after(a.microbatch)) {
      const int oldest = rule.oldest_needed_after(a.microbatch, stage);
      if (snapshots && live >= oldest) held.insert(live);
      held.erase(held.begin(), held.lower_bound(oldest));
      ++live;
    }
    std::set<int> alive = held;
    alive.insert(live);
    most = std::max(most, alive.size());
  }
  return static_cast<int>(most);
}

TEST(VersionRule, PipeDreamStashesUntilTheBackward) {
  const VersionRule rule{&find_weight_rule("pipedream"), 4, 8};
  // Stage 0 runs 3 forwards ahead: microbatch 10 uses W_0^(7) forward and backward.
  EXPECT_EQ(rule.forward_version(10, 0), 7);
  EXPECT_EQ(rule.backward_version(10, 0), 7);
  EXPECT_EQ(rule.forward_version(10, 3), 10);
  EXPECT_EQ(rule.forward_version(1, 0), 0);
  EXPECT_TRUE(rule.steps_after(0));
}

TEST(VersionRule, VerticalSyncUsesTheVersionAMicrobatchEnteredWith) {
  const VersionRule rule{&find_weight_rule("vertical-sync"), 4, 8};
  for (int stage = 0; stage < 4; ++stage) EXPECT_EQ(rule.forward_version(10, stage), 7);
}

TEST(VersionRule, TwoBWUsesThePreviousStepsWeights) {
  const VersionRule rule{&find_weight_rule("2bw"), 4, 8};
  EXPECT_EQ(rule.forward_version(7, 2), 0);   // step 0: W^(-1) = W^(0)
  EXPECT_EQ(rule.forward_version(8, 2), 0);   // step 1: W^(0)
  EXPECT_EQ(rule.forward_version(23, 0), 1);  // step 2: W^(1)
  EXPECT_FALSE(rule.steps_after(6));
  EXPECT_TRUE(rule.steps_after(7));
}

TEST(VersionRule, PipeMareUsesTheNewestWeightsForwardAndBackward) {
  const VersionRule rule{&find_weight_rule("pipemare"), 4, 2};
  // Stage 0 runs 3 forwards ahead: microbatch 5's forward follows the backwards of 0 and 1, one
  // step; its backward follows those of 0 .. 4, two steps.
  EXPECT_EQ(rule.forward_version(5, 0), 1);
  EXPECT_EQ(rule.backward_version(5, 0), 2);
  EXPECT_EQ(rule.forward_version(5, 3), 2);  // the last stage: no delay
  EXPECT_EQ(rule.backward_version(5, 3), 2);
  EXPECT_TRUE(rule.backward_reruns_forward());
  EXPECT_EQ(rule.delay(0), 2);  // ceil(3 / 2)
  EXPECT_EQ(rule.delay(2), 1);
  EXPECT_EQ(rule.delay(3), 0);
  EXPECT_EQ((VersionRule{&find_weight_rule("pipemare"), 4, 8}.delay(0)), 1);
  EXPECT_EQ((VersionRule{&find_weight_rule("2bw"), 4, 8}.delay(0)), 0);
  EXPECT_FALSE((VersionRule{&find_weight_rule("2bw"), 4, 8}.backward_reruns_forward()));
}

// The counts the documents give (PipeDream: stage s keeps S-s; vertical sync S; 2BW 2) are what
// the 1F1B order without flush really needs, and no action asks for a version already dropped.
TEST(VersionRule, VersionsKeptAreWhatThePipelinedOrderNeeds) {
  for (const WeightRule* update :
       {&find_weight_rule("pipedream"), &find_weight_rule("vertical-sync"),
        &find_weight_rule("2bw"), &find_weight_rule("pipemare"), &find_weight_rule("ampnet")}) {
    for (int stages : {1, 2, 4, 5}) {
      for (int m : {1, 2, 3, 4, 8}) {
        const VersionRule rule{update, stages, m};
        if (!rule.fits_1f1b()) continue;
        const Schedule order = make_1f1b(stages, 4 * m);  // four steps, no flush
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(std::string(update->name()) + " S=" + std::to_string(stages) +
                       " M=" + std::to_string(m) + " stage " + std::to_string(s));
          EXPECT_EQ(replay_most_versions(rule, order, s), rule.versions_kept(s));
        }
      }
    }
  }
}

TEST(VersionRule, AmpNetStepsEveryUpdateIntervalOnTheNewestWeights) {
  VersionRule rule{&find_weight_rule("ampnet"), 4, 8};
  EXPECT_EQ(rule.period(), 1);  // --update-interval 1 by default
  rule.update_interval = 3;
  EXPECT_EQ(rule.period(), 3);
  EXPECT_FALSE(rule.steps_after(1));
  EXPECT_TRUE(rule.steps_after(2));
  EXPECT_TRUE(rule.steps_after(5));
  // Stage 0's forward of microbatch 10 follows 7 backwards (2 steps), its backward 10 (3).
  EXPECT_EQ(rule.forward_version(10, 0), 2);
  EXPECT_EQ(rule.backward_version(10, 0), 3);
  EXPECT_EQ(rule.delay(0), 1);  // ceil(3 / 3)
  EXPECT_EQ(rule.delay(3), 0);
  EXPECT_TRUE(rule.backward_reruns_forward());
  EXPECT_FALSE(rule.predicts());
  EXPECT_EQ(rule.versions_kept(0), 1);
}

TEST(VersionRule, SpecTrainPredictsWithThePapersLags) {
  const VersionRule rule{&find_weight_rule("spectrain"), 4, 8};
  EXPECT_TRUE(rule.predicts());
  EXPECT_EQ(rule.period(), 1);
  EXPECT_EQ(rule.prediction_group(), 1);
  // forward floor(s/2) + S-1-s, backward floor(s/2)
  const int forward[] = {3, 2, 2, 1};
  const int backward[] = {0, 0, 1, 1};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(rule.prediction_lag(s, false), forward[s]) << "stage " << s;
    EXPECT_EQ(rule.prediction_lag(s, true), backward[s]) << "stage " << s;
    EXPECT_EQ(rule.versions_kept(s), 2);
    // Both passes aim at version i + floor(s/2) once the pipeline is full.
    for (int i = 3; i < 20; ++i) {
      EXPECT_EQ(rule.forward_version(i, s) + forward[s], i + s / 2);
      EXPECT_EQ(rule.backward_version(i, s) + backward[s], i + s / 2);
    }
  }
  // Two stages: the last has nothing to predict, so no copy.
  const VersionRule two{&find_weight_rule("spectrain"), 2, 4};
  EXPECT_EQ(two.prediction_lag(1, false), 0);
  EXPECT_EQ(two.prediction_lag(1, true), 0);
  EXPECT_EQ(two.versions_kept(1), 1);
  EXPECT_EQ(two.versions_kept(0), 2);
}

TEST(VersionRule, XPipePredictsOncePerMiniBatchWithRoundedLags) {
  const VersionRule rule{&find_weight_rule("xpipe"), 4, 2};
  EXPECT_EQ(rule.period(), 2);
  EXPECT_EQ(rule.prediction_group(), 2);
  // forward round((S + M - s/2 - 2) / M) = round((4 - s/2) / 2): 2, 1.75, 1.5, 1.25; a tie
  // goes to the even neighbour, as Python's round.
  const int forward[] = {2, 2, 2, 1};
  // backward round((M - 1 + floor(s/2)) / M) = round((1 + floor(s/2)) / 2): 0.5, 0.5, 1, 1
  const int backward[] = {0, 0, 1, 1};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(rule.prediction_lag(s, false), forward[s]) << "stage " << s;
    EXPECT_EQ(rule.prediction_lag(s, true), backward[s]) << "stage " << s;
    EXPECT_EQ(rule.versions_kept(s), 1 + (forward[s] > 0) + (backward[s] > 0));
  }
  // Every microbatch of a mini-batch starts from the versions of its first one.
  EXPECT_EQ(rule.forward_version(9, 0), rule.forward_version(8, 0));
  EXPECT_EQ(rule.forward_version(8, 0), 2);  // 8 - 3 = 5 backwards before it: 2 steps
  EXPECT_EQ(rule.backward_version(9, 0), 4);
}

// A predicting rule's first microbatch of each group predicts from its versions; in the
// pipelined 1F1B order those versions are the live ones at that moment, so the pipeline needs
// no stored version.
TEST(VersionRule, PredictionsStartFromTheLiveVersionInThePipelinedOrder) {
  for (const WeightRule* update : {&find_weight_rule("spectrain"), &find_weight_rule("xpipe")}) {
    for (int stages : {1, 2, 4, 5}) {
      for (int m : {1, 2, 3, 4, 8}) {
        const VersionRule rule{update, stages, m};
        const Schedule order = make_1f1b(stages, 4 * m);
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(std::string(update->name()) + " S=" + std::to_string(stages) +
                       " M=" + std::to_string(m) + " stage " + std::to_string(s));
          int live = 0;
          for (const Action& a : order.actions[s]) {
            if (a.op != Op::F && a.op != Op::B) continue;
            const bool backward = a.op == Op::B;
            const int i = a.microbatch;
            if (i % rule.prediction_group() == 0) {
              EXPECT_EQ(backward ? rule.backward_version(i, s) : rule.forward_version(i, s), live)
                  << to_string(a);
            }
            if (backward && rule.steps_after(i)) ++live;
          }
        }
      }
    }
  }
}

// WPipe's own order: the first group keeps 2 versions (as 2bw), the second 1, and every action
// finds its version; its generator waits for the versions instead of needing enough microbatches.
TEST(VersionRule, WPipeOrderNeedsTwoVersionsOnTheFirstGroupAndOneOnTheSecond) {
  for (int ranks : {1, 2, 4}) {
    for (int m : {1, 2, 3, 8}) {
      const VersionRule rule{&find_weight_rule("wpipe"), 2 * ranks, m};
      const Schedule order = make_wpipe(ranks, 4 * m, m);
      for (int s = 0; s < 2 * ranks; ++s) {
        SCOPED_TRACE("P=" + std::to_string(ranks) + " M=" + std::to_string(m) + " stage " +
                     std::to_string(s));
        EXPECT_EQ(rule.versions_kept(s), s < ranks ? 2 : 1);
        EXPECT_LE(replay_most_versions(rule, order, s), rule.versions_kept(s));
      }
    }
  }
  const VersionRule rule{&find_weight_rule("wpipe"), 4, 8};
  EXPECT_EQ(rule.forward_version(8, 1), 0);   // step 1 on the first group: W^(0)
  EXPECT_EQ(rule.forward_version(8, 2), 1);   // on the second: W^(1)
  EXPECT_EQ(rule.forward_version(23, 0), 1);  // step 2: W^(1) and W^(2)
  EXPECT_EQ(rule.forward_version(23, 3), 2);
}

// 2BW with fewer microbatches per step than S - 1: stage 0's forwards run two steps ahead and
// would need a version that does not exist yet (the paper asks for m >= the pipeline depth).
TEST(VersionRule, TwoBWNeedsEnoughMicrobatchesPerStep) {
  EXPECT_FALSE((VersionRule{&find_weight_rule("2bw"), 4, 2}.fits_1f1b()));
  EXPECT_TRUE((VersionRule{&find_weight_rule("2bw"), 4, 3}.fits_1f1b()));
  const VersionRule too_few{&find_weight_rule("2bw"), 4, 2};
  int asked_for_missing = 0;
  const Schedule order = make_1f1b(4, 8);
  for (const Action& a : order.actions[0]) {
    if (a.op != Op::F) continue;
    // Stage 0's forward of microbatch i runs after max(0, i - 3) backwards, and with a step
    // every 2 microbatches the live version is then (i - 3) / 2.
    const int live = std::max(0, a.microbatch - 3) / 2;
    asked_for_missing += too_few.forward_version(a.microbatch, 0) > live;
  }
  EXPECT_GT(asked_for_missing, 0);
}

}  // namespace
}  // namespace pptrain
