// zb-auto on its own: every schedule it makes is valid, keeps the memory limit (one for all ranks
// or one per rank) when its actions are counted in order (the simulator's timed count is in
// pptrain/sim/simulator_test.cpp), is never slower than the fixed orders that fit, and bad input
// is refused with one line.
#include "pptrain/generators/auto_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

StageCosts random_costs(int stages, std::mt19937& rng) {
  std::uniform_real_distribution<double> time(0.2, 3), stash(0, 1), activation(0.5, 2);
  StageCosts c;
  for (int s = 0; s < stages; ++s) {
    c.forward.push_back(time(rng));
    c.backward_input.push_back(time(rng));
    c.backward_weight.push_back(time(rng));
    c.activation.push_back(activation(rng));
    c.weight_stash.push_back(stash(rng) * c.activation.back());
  }
  c.comm = std::uniform_real_distribution<double>(0, 0.5)(rng);
  return c;
}

TEST(ZbAuto, ValidAndWithinTheLimitForManyShapesCostsAndLimits) {
  std::mt19937 rng(14);
  for (int p : {1, 2, 3, 4, 6, 8}) {
    for (int m : {1, 2, p, 2 * p + 1, 4 * p}) {
      for (int trial = 0; trial < 3; ++trial) {
        const StageCosts c = trial == 0 ? StageCosts::uniform(p) : random_costs(p, rng);
        const double smallest = smallest_memory_limit(c);
        for (double limit : {smallest, 1.5 * smallest, 1.0 * p, 2.0 * p, 3.5 * p, 0.0}) {
          if (limit > 0 && limit < smallest) continue;
          SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " trial " +
                       std::to_string(trial) + " limit " + std::to_string(limit));
          const Schedule s = make_zb_auto({p, m, c, limit});
          EXPECT_NO_THROW(validate(s));
          EXPECT_EQ(s.name, "zb-auto");
          EXPECT_TRUE(s.has_split_backward());
          if (limit > 0) {
            EXPECT_LE(peak_in_order(s, c), limit + 1e-9);
          }
        }
      }
    }
  }
}

// A greedy candidate is skipped when its warm-up repeats an earlier one's and its rounds read the
// same flags, and stopped once it cannot beat the best so far: running every candidate to the
// end gives the same schedule, action for action.
TEST(ZbAuto, PruningCandidatesChangesNothing) {
  std::mt19937 rng(41);
  for (int p : {2, 3, 4, 8}) {
    for (int m : {1, 3, p, 2 * p + 1, 8 * p}) {
      for (int trial = 0; trial < 4; ++trial) {
        const StageCosts c = trial == 0 ? StageCosts::uniform(p) : random_costs(p, rng);
        const double smallest = smallest_memory_limit(c);
        for (double limit : {smallest, 1.5 * smallest, 0.75 * p, 1.0 * p, 2.0 * p, 0.0}) {
          if (limit > 0 && limit < smallest) continue;
          SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " trial " +
                       std::to_string(trial) + " limit " + std::to_string(limit));
          AutoScheduleOptions every{p, m, c, limit};
          every.prune_candidates = false;
          const Schedule all = make_zb_auto(every);
          const Schedule pruned = make_zb_auto({p, m, c, limit});
          EXPECT_EQ(pruned.actions, all.actions);
        }
      }
    }
  }
}

// Each rank keeps its own limit, and zb-auto is never slower than a fixed order that fits those
// limits: 1F1B's (each W right after its I), ZB-H1's and ZB-H2's.
TEST(ZbAuto, PerRankLimitsAndNeverSlowerThanTheFixedOrdersThatFit) {
  std::mt19937 rng(32);
  int fixed_fit = 0;
  for (int p : {2, 3, 4, 6}) {
    for (int m : {1, p, 2 * p + 1, 4 * p}) {
      for (int trial = 0; trial < 6; ++trial) {
        const StageCosts c = random_costs(p, rng);
        const std::vector<Schedule> fixed = {make_1f1b_split(p, m), make_zb_h1(p, m),
                                             make_zb_h2(p, m)};
        // Limits: each rank at its peak under one of the fixed orders, at its smallest, or none.
        const std::vector<double> one_f_one_b = peaks_in_order(fixed[0], c);
        const std::vector<double> h2 = peaks_in_order(fixed[2], c);
        std::vector<double> limits(p);
        for (int r = 0; r < p; ++r) {
          const int pick = std::uniform_int_distribution<int>(0, 3)(rng);
          limits[r] = pick == 0   ? c.activation[r]
                      : pick == 1 ? one_f_one_b[r]
                      : pick == 2 ? h2[r]
                                  : 0.0;
        }
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " trial " +
                     std::to_string(trial));
        AutoScheduleOptions o{p, m, c, 0, limits};
        double predicted = 0;
        const Schedule s = make_zb_auto(o, &predicted);
        EXPECT_NO_THROW(validate(s));
        const std::vector<double> peaks = peaks_in_order(s, c);
        for (int r = 0; r < p; ++r) {
          if (limits[r] > 0) {
            EXPECT_LE(peaks[r], limits[r] * (1 + 1e-9)) << "rank " << r;
          }
        }
        const std::optional<ScheduleTiming> timing = timed_in_order(s, c);
        ASSERT_TRUE(timing.has_value());
        EXPECT_NEAR(timing->span, predicted, 1e-9 * predicted);
        for (const Schedule& f : fixed) {
          if (!within_limits(f, c, limits)) continue;
          ++fixed_fit;
          EXPECT_LE(timing->makespan, timed_in_order(f, c)->makespan * (1 + 1e-12)) << f.name;
        }
      }
    }
  }
  EXPECT_GT(fixed_fit, 50);  // the comparison ran
}

TEST(ZbAuto, ByNameThroughTheRegistry) {
  ScheduleOptions o{"zb-auto", 4, 8};
  o.memory_limit = 4;
  const Schedule s = make_schedule(o);
  EXPECT_NO_THROW(validate(s));
  EXPECT_LE(peak_in_order(s, StageCosts::uniform(4)), 4 + 1e-9);
  // Without costs it plans for F = I = W = 1; the same as giving them.
  o.costs = StageCosts::uniform(4);
  EXPECT_EQ(make_schedule(o), s);
  EXPECT_THROW(make_schedule({"zb-auto", 4, 8, 2}), UserError);  // one chunk per rank
}

TEST(ZbAuto, SmallestLimitRunsOneMicrobatchAtATime) {
  // At the smallest limit every rank holds one microbatch: F, I, W in turn.
  const Schedule tight = make_zb_auto({3, 4, StageCosts::uniform(3), 1});
  for (const auto& list : tight.actions) {
    for (size_t k = 0; k < list.size(); ++k) {
      EXPECT_EQ(list[k].op, k % 3 == 0 ? Op::F : k % 3 == 1 ? Op::I : Op::W) << k;
    }
  }
}

TEST(ZbAuto, BadInputIsOneLine) {
  StageCosts wrong = StageCosts::uniform(3);
  const std::vector<std::pair<AutoScheduleOptions, std::string>> bad = {
      {{0, 4, {}, 0}, "ranks must be >= 1, got 0"},
      {{2, 0, {}, 0}, "microbatches must be >= 1, got 0"},
      {{2, 4, wrong, 0}, "forward costs have 3 entries but the schedule has 2 stages"},
      {{3, 4, {}, -1}, "--memory-limit must be a finite number >= 0"},
      {{3, 4, {}, 0.5},
       "--memory-limit 0.5 is below what any schedule needs: the smallest limit that works is 1"},
  };
  for (const auto& [options, expected] : bad) {
    try {
      make_zb_auto(options);
      ADD_FAILURE() << expected;
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  // A limit per rank: the first rank below one microbatch of its stage is named.
  StageCosts uneven = StageCosts::uniform(3);
  uneven.activation = {3, 2, 1};
  uneven.weight_stash = {1, 1, 0.5};
  try {
    make_zb_auto({3, 4, uneven, 0, {4, 1.5, 1}});
    ADD_FAILURE() << "rank 1's limit 1.5 is below its activation 2";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "zb-auto: rank 1's memory limit 1.5 is below what one microbatch needs there: "
                 "the smallest limit that works on rank 1 is 2 (its stage's forward activations)");
  }
  EXPECT_THROW(make_zb_auto({3, 4, uneven, 0, {4, 4}}), UserError);  // not one per rank
  EXPECT_NO_THROW(make_zb_auto({3, 4, uneven, 0, {3, 2, 0}}));

  wrong.backward_weight[1] = -1;
  EXPECT_THROW(make_zb_auto({3, 4, wrong, 0}), UserError);
}

}  // namespace
}  // namespace pptrain
