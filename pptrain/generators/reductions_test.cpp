#include "pptrain/schedule/reductions.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

Action reduce(int stage) {
  return Action::make(Op::REDUCE_GRAD, stage, -1);
}

// Position of `action` in `list`, or -1.
int position_of(const std::vector<Action>& list, const Action& action) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == action) return static_cast<int>(i);
  }
  return -1;
}

// Checks the rule of reductions.h on every rank: each stage of the rank has one REDUCE_GRAD,
// right after its last W or B (after the SENDs that follow that action when lowered).
void expect_reductions_after_last_weight_grads(const Schedule& reduced) {
  for (int r = 0; r < reduced.num_ranks; ++r) {
    const auto& list = reduced.actions[r];
    for (int s : reduced.stages_of(r)) {
      const int at = position_of(list, reduce(s));
      ASSERT_GE(at, 0) << "rank " << r << " has no " << to_string(reduce(s));
      int last = -1;
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        for (const Action& atom : atoms_of(list[i])) {
          if (computes_weight_grads(atom.op) && atom.stage == s) last = i;
        }
      }
      ASSERT_GE(last, 0);
      EXPECT_LT(last, at) << to_string(reduce(s));
      // Between the last W or B and the reduction: only sends and other stages' reductions.
      for (int i = last + 1; i < at; ++i) {
        const Op op = list[i].op;
        EXPECT_TRUE(op == Op::SEND_F || op == Op::SEND_B || op == Op::REDUCE_GRAD)
            << "rank " << r << " position " << i << ": " << to_string(list[i]);
      }
    }
  }
}

TEST(Reductions, OneFOneBReducesAfterEachRanksLastBackward) {
  const Schedule s = make_schedule({"1f1b", 2, 4});
  const Schedule reduced = add_grad_reductions(s);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(reduced.actions[r].size(), s.actions[r].size() + 1);
    EXPECT_EQ(reduced.actions[r].back(), reduce(r));
  }
  EXPECT_TRUE(has_grad_reductions(reduced));
  EXPECT_FALSE(has_grad_reductions(s));
  EXPECT_EQ(remove_grad_reductions(reduced), s);
  EXPECT_NO_THROW(validate(reduced));
}

TEST(Reductions, EverySynchronousScheduleComputeOnlyAndLowered) {
  for (const auto& name : schedule_names()) {
    const ScheduleEntry& entry = find_schedule(name);
    if (entry.asynchronous()) continue;
    const Schedule s = make_schedule({name, 4, 8});
    const Schedule reduced = add_grad_reductions(s);
    SCOPED_TRACE(name);
    expect_reductions_after_last_weight_grads(reduced);
    EXPECT_NO_THROW(validate(reduced));
    // Reducing before or after lowering gives one schedule, and lowering keeps the reductions.
    const Schedule lowered = add_grad_reductions(lower(s));
    expect_reductions_after_last_weight_grads(lowered);
    EXPECT_EQ(lowered, lower(reduced));
    EXPECT_EQ(*validate(reduced), lowered);
    // Idempotent.
    EXPECT_EQ(add_grad_reductions(reduced), reduced);
    EXPECT_EQ(add_grad_reductions(lowered), lowered);
  }
}

TEST(Reductions, ZbVReducesItsEarlyStageBeforeTheCoolDownEnds) {
  // zb-v holds stages r and 2P-1-r on rank r; the W's of one finish before the other's, so the
  // first reduction is not the rank's last action.
  const Schedule reduced = add_grad_reductions(make_schedule({"zb-v", 2, 4}));
  bool early = false;
  for (const auto& list : reduced.actions) {
    if (list[list.size() - 2].op != Op::REDUCE_GRAD) early = true;
  }
  EXPECT_TRUE(early) << to_csv(reduced);
}

TEST(Reductions, InsideACompositeAndInPartOrder) {
  // Rank 0's last action completes stage 0 (inside an OVERLAP_F_B) and stage 2 at once: both are
  // reduced after it, in the order of its parts.
  const Schedule s = parse_csv(
      "0F0,2F0,2B0,(0B0;2F1)OVERLAP_F_B,0F1,(2B1;0B1)OVERLAP_F_B\n"
      "1F0,3F0,3B0,1B0,1F1,3F1,3B1,1B1\n");
  const Schedule reduced = add_grad_reductions(s);
  const auto& list = reduced.actions[0];
  ASSERT_EQ(list.size(), 8u);
  EXPECT_EQ(list[6], reduce(2));
  EXPECT_EQ(list[7], reduce(0));
  EXPECT_EQ(reduced.actions[1].back(), reduce(1));
  EXPECT_EQ(reduced.actions[1][7], reduce(3));
}

TEST(Reductions, AfterTheSendsOfALoweredSchedule) {
  const Schedule reduced = add_grad_reductions(lower(make_schedule({"1f1b", 2, 2})));
  // Rank 1: ..., 1B1, 1SEND_B1, 1REDUCE_GRAD.
  const auto& list = reduced.actions[1];
  EXPECT_EQ(to_string(list[list.size() - 3]), "1B1");
  EXPECT_EQ(to_string(list[list.size() - 2]), "1SEND_B1");
  EXPECT_EQ(list.back(), reduce(1));
}

TEST(Reductions, RefusesAnAsynchronousSchedule) {
  Schedule s = make_schedule({"pipedream", 2, 4});
  try {
    add_grad_reductions(s);
    FAIL() << "accepted an asynchronous schedule";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("asynchronous"), std::string::npos) << e.what();
  }
}

TEST(Reductions, CsvKeepsThem) {
  const Schedule reduced = add_grad_reductions(make_schedule({"interleaved-1f1b", 2, 4, 2}));
  const std::string text = to_csv(reduced);
  EXPECT_NE(text.find(",0REDUCE_GRAD"), std::string::npos) << text;
  Schedule back = parse_csv(text, reduced.name);
  EXPECT_EQ(back, reduced);
}

// Replicated stages: every replica of a stage with two or more replicas reduces it once, after
// its own last backward of the stage; a stage with one replica is not reduced; the replicas
// reduce in the same order.
TEST(Reductions, ReplicatedStagesReduceOnEachReplica) {
  for (const Schedule& s : {make_chimera(4, 8), make_gems(6, 4), make_chimera(8, 8),
                            make_1f1b_rr({3, 1}, 6), make_1f1b_rr({2, 1, 2}, 7)}) {
    SCOPED_TRACE(s.name + " P=" + std::to_string(s.num_ranks));
    const Schedule reduced = add_grad_reductions(s);
    EXPECT_NO_THROW(validate(reduced));
    std::vector<std::vector<int>> order(s.num_ranks);  // [rank] stages in reduction order
    for (int r = 0; r < s.num_ranks; ++r) {
      const auto& list = reduced.actions[r];
      for (const Action& a : list) {
        if (is_collective(a.op)) order[r].push_back(a.stage);
      }
      std::vector<int> expected;
      for (int st : s.stages_of(r)) {
        if (s.replicas_of(st).size() < 2) continue;
        expected.push_back(st);
        int last = -1;
        for (int i = 0; i < static_cast<int>(list.size()); ++i) {
          if (list[i].op == Op::B && list[i].stage == st) last = i;
        }
        EXPECT_GT(position_of(list, reduce(st)), last) << "rank " << r << " stage " << st;
      }
      std::vector<int> got = order[r];
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, expected) << "rank " << r;
    }
    // Two ranks sharing stages reduce them in the same order.
    for (int a = 0; a < s.num_ranks; ++a) {
      for (int b = 0; b < s.num_ranks; ++b) {
        std::vector<int> shared;
        for (int st : order[a]) {
          if (std::find(order[b].begin(), order[b].end(), st) != order[b].end())
            shared.push_back(st);
        }
        std::vector<int> other;
        for (int st : order[b]) {
          if (std::find(shared.begin(), shared.end(), st) != shared.end()) other.push_back(st);
        }
        EXPECT_EQ(shared, other) << "ranks " << a << " and " << b;
      }
    }
    EXPECT_EQ(add_grad_reductions(reduced), reduced);
    EXPECT_EQ(add_grad_reductions(lower(s)), lower(reduced));
    EXPECT_EQ(remove_grad_reductions(reduced), s);
  }
  // 1f1b-rr [3, 1]: stage 0 on ranks 0..2 reduces, stage 1 (one replica) does not.
  const Schedule rr = add_grad_reductions(make_1f1b_rr({3, 1}, 6));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(rr.actions[r].back(), reduce(0));
  EXPECT_TRUE(std::none_of(rr.actions[3].begin(), rr.actions[3].end(),
                           [](const Action& a) { return is_collective(a.op); }));
}

// The one rule of when a run's gradients are combined: the copies' all-reduce for copies > 1
// (not for a schedule that averages its copies itself), the replicas' sums for a replicated
// schedule that places none of its own, nothing else.
TEST(GradReductions, WithGradReductionsIsTheOneRule) {
  const Schedule plain = make_schedule({"1f1b", 2, 4});
  EXPECT_EQ(with_grad_reductions(plain), plain);
  EXPECT_EQ(with_grad_reductions(plain, 2), add_grad_reductions(plain));
  EXPECT_EQ(with_grad_reductions(plain, 2, /*averages_copies=*/true), plain);
  const Schedule replicated = make_schedule({"chimera", 4, 8});
  ASSERT_TRUE(replicated.replicated());
  EXPECT_EQ(with_grad_reductions(replicated), add_grad_reductions(replicated));
  // A replicated schedule that places its own reductions keeps them where they are.
  Schedule own = add_grad_reductions(replicated);
  std::swap(own.actions[0][own.actions[0].size() - 1], own.actions[0][own.actions[0].size() - 2]);
  ASSERT_FALSE(own == add_grad_reductions(replicated));
  EXPECT_EQ(with_grad_reductions(own), own);
  // An asynchronous schedule runs without reductions; asked for copies, it is refused.
  const Schedule asynchronous = make_schedule({"pipedream", 2, 4});
  EXPECT_EQ(with_grad_reductions(asynchronous), asynchronous);
  EXPECT_THROW(with_grad_reductions(asynchronous, 2), UserError);
}

}  // namespace
}  // namespace pptrain
