#include "pptrain/schedule/validate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/generators/testing.h"
#include "pptrain/schedule/grid.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

using testing::contains;

ScheduleError error_of(const Schedule& schedule) {
  return testing::validation_error(schedule);
}

// 1F1B on two ranks, two microbatches, compute only.
const char* const kOneFOneB = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";

TEST(Validate, AcceptsCorrectSchedulesWithAndWithoutComms) {
  const Schedule s = parse_csv(kOneFOneB);
  EXPECT_NO_THROW(validate(s));
  EXPECT_NO_THROW(validate(lower(s)));
  // Interleaved placement (stage s on rank s % 2) with split backward.
  const Schedule v = parse_csv(
      "0F0,2F0,2I0,2W0,0I0,0W0\n"
      "1F0,3F0,3I0,1I0,3W0,1W0\n");
  EXPECT_NO_THROW(validate(v));
  EXPECT_NO_THROW(validate(lower(v)));
  // A V shape: stages 1 and 2 on rank 1 pass their tensors without communication.
  const Schedule shape = parse_csv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n");
  EXPECT_EQ(shape.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_NO_THROW(validate(lower(shape)));
}

TEST(Validate, MessageNamesRankPositionActionAndShowsTheGrid) {
  // The task's example: rank 1 runs 1B0 before 1F0.
  const ScheduleError e = error_of(parse_csv("0F0,0F1,0B0,0B1\n1F1,1B0,1B1,1F0\n"));
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.what(),
                       "rank 1, position 1 (1B0): backward of stage 1 microbatch 0 "
                       "runs before its forward 1F0 (position 3)"))
      << e.what();
  EXPECT_TRUE(contains(e.what(), "\nrank 0 | 0F0  0F1  0B0  0B1\nrank 1 | 1F1 [1B0] 1B1  1F0"))
      << e.what();
}

TEST(Validate, MissingAction) {
  // 1B1 is missing: the error points at the forward whose backward never runs.
  ScheduleError e = error_of(parse_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n"));
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 2);
  EXPECT_TRUE(contains(e.message(), "forward of stage 1 microbatch 1 has no backward")) << e.what();
  // A W without its I.
  e = error_of(parse_csv("0F0,0W0\n1F0,1B0\n"));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.message(), "0W0 has no 0I0")) << e.what();
  // An I without its W.
  e = error_of(parse_csv("0F0,0I0\n1F0,1B0\n"));
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.message(), "0I0 has no 0W0")) << e.what();
  // Nothing at all for one (stage, microbatch): only the rank can be named.
  Schedule s = parse_csv(kOneFOneB);
  s.num_microbatches = 3;
  e = error_of(s);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), -1);
  EXPECT_TRUE(contains(e.what(), "rank 0: stage 0 microbatch 2 has no actions")) << e.what();
}

TEST(Validate, TooFewActionsForTheShapeIsAShapeError) {
  // M = 10^9 from one cell: rejected by counting, before any table is sized by M.
  const ScheduleError e = error_of(parse_csv("0F0,0B999999999\n"));
  EXPECT_EQ(e.rank(), -1);
  EXPECT_TRUE(contains(e.what(),
                       "schedule has 2 compute actions for 1 stages and 1000000000 "
                       "microbatches; expected 2000000000"))
      << e.what();
}

TEST(Validate, DuplicateAction) {
  ScheduleError e = error_of(parse_csv("0F0,0F1,0B0,0F1,0B1\n1F0,1B0,1F1,1B1\n"));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 3);
  EXPECT_TRUE(contains(e.message(), "second 0F1 (the first is at rank 0, position 1)")) << e.what();
  // B and I for the same microbatch.
  e = error_of(parse_csv("0F0,0B0,0I0\n1F0,1B0\n"));
  EXPECT_EQ(e.position(), 2);
  EXPECT_TRUE(contains(e.message(), "already has 0B0")) << e.what();
  // A duplicated receive in a lowered schedule.
  Schedule lowered = lower(parse_csv(kOneFOneB));
  lowered.actions[1].insert(lowered.actions[1].begin() + 1, Action::make(Op::RECV_F, 1, 0));
  e = error_of(lowered);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.message(), "second 1RECV_F0")) << e.what();
}

TEST(Validate, WrongOrderOnOneRank) {
  // W before I.
  ScheduleError e = error_of(parse_csv("0F0,0W0,0I0\n1F0,1B0\n"));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.message(), "runs before 0I0 (position 2)")) << e.what();
  // V shape: stage 2 (rank 1) runs its forward before stage 1's on the same rank.
  e = error_of(parse_csv("0F0,3F0,3B0,0B0\n2F0,1F0,2B0,1B0\n"));
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 0);
  EXPECT_TRUE(contains(e.message(), "runs before its input's forward 1F0 (position 1)"))
      << e.what();
  // V shape: stage 1's backward before stage 2's on the same rank.
  e = error_of(parse_csv("0F0,3F0,3B0,0B0\n1F0,2F0,1B0,2B0\n"));
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 2);
  EXPECT_TRUE(
      contains(e.message(), "runs before 2B0 (position 3, it produces the output gradient)"))
      << e.what();
  // With comms: the send before the forward that produces it.
  Schedule lowered = lower(parse_csv(kOneFOneB));
  ASSERT_EQ(to_string(lowered.actions[0][1]), "0SEND_F0");
  std::swap(lowered.actions[0][0], lowered.actions[0][1]);
  e = error_of(lowered);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 0);
  EXPECT_TRUE(contains(e.message(), "0SEND_F0 runs before 0F0 (position 1")) << e.what();
}

TEST(Validate, WrongRank) {
  Schedule s = parse_csv(kOneFOneB);
  s.stage_to_rank = {1, 0};  // the lists say otherwise
  ScheduleError e = error_of(s);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 0);
  EXPECT_TRUE(contains(e.message(), "stage 0 runs on rank 1 (stage_to_rank), not on rank 0"))
      << e.what();
}

TEST(Validate, OutOfRangeIndex) {
  Schedule s = parse_csv(kOneFOneB);
  s.actions[1][2] = Action::make(Op::F, 1, 7);
  ScheduleError e = error_of(s);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 2);
  EXPECT_TRUE(contains(e.message(),
                       "microbatch 7 is out of range (the schedule has 2 "
                       "microbatches, 0..1)"))
      << e.what();
  s = parse_csv(kOneFOneB);
  s.actions[0][3] = Action::make(Op::B, 5, 1);
  e = error_of(s);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 3);
  EXPECT_TRUE(contains(e.message(), "stage 5 is out of range")) << e.what();
  // Shape errors concern the whole schedule.
  s = parse_csv(kOneFOneB);
  s.stage_to_rank = {0, 2};
  e = error_of(s);
  EXPECT_EQ(e.rank(), -1);
  EXPECT_TRUE(contains(e.what(), "stage 1 is placed on rank 2; expected a rank in 0..1"))
      << e.what();
}

TEST(Validate, UnmatchedSendAndReceive) {
  Schedule lowered = lower(parse_csv(kOneFOneB));
  Schedule no_recv = lowered;
  auto& l = no_recv.actions[1];
  // Remove 1RECV_F1 from rank 1: 0SEND_F1 is left without a receive, and 1F1 has no input.
  const auto it = std::find(l.begin(), l.end(), Action::make(Op::RECV_F, 1, 1));
  ASSERT_NE(it, l.end());
  l.erase(it);
  ScheduleError e = error_of(no_recv);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(contains(e.message(), "forward of stage 1 microbatch 1 needs 1RECV_F1")) << e.what();
  // Remove a send instead: the receive on the other rank has no partner.
  Schedule no_send = lowered;
  auto& s0 = no_send.actions[0];
  const auto send = std::find(s0.begin(), s0.end(), Action::make(Op::SEND_F, 0, 1));
  ASSERT_NE(send, s0.end());
  s0.erase(send);
  e = error_of(no_send);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(to_string(no_send.actions[1][e.position()]), "1RECV_F1");
  EXPECT_TRUE(contains(e.message(), "no matching 0SEND_F1 on rank 0")) << e.what();
}

TEST(Validate, DeadlockAcrossTwoRanks) {
  // Each rank runs its microbatch 1 work in an order that waits on the other: rank 0 wants 1B0's
  // gradient before sending 0F1, rank 1 wants 0F1's output before running 1B0.
  const Schedule s = parse_csv("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n");
  ScheduleError e = error_of(s);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 1);
  EXPECT_TRUE(contains(e.message(), "deadlock")) << e.what();
  EXPECT_TRUE(contains(e.message(),
                       "rank 0 waits at position 1 (0B0) for its output gradient "
                       "from 1B0 on rank 1"))
      << e.what();
  EXPECT_TRUE(contains(e.message(),
                       "rank 1 waits at position 1 (1F1) for its input from 0F1 on "
                       "rank 0"))
      << e.what();
  // The same deadlock, lowered: reported at the receives.
  e = error_of(lower(s));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(to_string(lower(s).actions[0][e.position()]), "0RECV_B0");
  EXPECT_TRUE(contains(e.message(), "for 1SEND_B0 on rank 1")) << e.what();
}

// A compute-only schedule's deadlock check runs without its messages: it must find exactly the
// deadlocks of the schedule lower() makes of it, with the same ranks stuck at the same actions.
// Random moves of one action (most break the order on a rank; those that do not may deadlock
// across ranks) in schedules with two chunks, composites, replicas and a skip connection.
TEST(Validate, ComputeOnlyDeadlocksAreTheLoweredSchedulesDeadlocks) {
  std::vector<Schedule> schedules;
  for (const char* name : {"1f1b", "zb-v", "dualpipev", "chimera", "interleaved-1f1b"}) {
    schedules.push_back(make_schedule({name, 4, 8}));
  }
  Schedule skip = make_schedule({"gpipe", 4, 3});
  skip.skips = {{0, 3}};
  schedules.push_back(skip);
  // The positions of the stuck ranks that a deadlock message lists, in order.
  const auto stuck_at = [](const ScheduleError& e) {
    std::vector<std::pair<int, int>> stuck;
    const std::string& m = e.message();
    for (size_t at = m.find(" rank "); at != std::string::npos; at = m.find(" rank ", at + 1)) {
      int rank = 0, position = 0;
      if (std::sscanf(m.c_str() + at, " rank %d waits at position %d", &rank, &position) == 2) {
        stuck.emplace_back(rank, position);
      }
    }
    return stuck;
  };
  std::mt19937 rng(31);
  int deadlocks = 0, passes = 0;
  for (const Schedule& base : schedules) {
    for (int trial = 0; trial < 300; ++trial) {
      Schedule s = base;
      auto& list = s.actions[rng() % s.num_ranks];
      const size_t from = rng() % list.size(), to = rng() % list.size();
      const Action moved = list[from];
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(from));
      list.insert(list.begin() + static_cast<std::ptrdiff_t>(to), moved);
      const Schedule lowered = lower(s);
      std::optional<ScheduleError> compute_error, lowered_error;
      try {
        validate(s);
      } catch (const ScheduleError& e) {
        compute_error = e;
      }
      try {
        validate(lowered);
      } catch (const ScheduleError& e) {
        lowered_error = e;
      }
      const auto deadlock = [](const std::optional<ScheduleError>& e) {
        return e && contains(e->message(), "deadlock");
      };
      if (!compute_error) {
        EXPECT_FALSE(lowered_error) << lowered_error->what();
        ++passes;
        continue;
      }
      ASSERT_EQ(deadlock(compute_error), deadlock(lowered_error)) << compute_error->what();
      if (!deadlock(compute_error)) continue;
      ++deadlocks;
      // The lowered schedule's positions, counted in compute actions (and reductions).
      std::vector<std::pair<int, int>> expected;
      for (const auto& [rank, position] : stuck_at(*lowered_error)) {
        const auto& row = lowered.actions[rank];
        expected.emplace_back(
            rank, static_cast<int>(std::count_if(row.begin(), row.begin() + position,
                                                 [](const Action& a) { return !is_comm(a.op); })));
      }
      EXPECT_EQ(stuck_at(*compute_error), expected) << compute_error->what();
      EXPECT_EQ(compute_error->rank(), lowered_error->rank());
    }
  }
  // The moves reached both outcomes.
  EXPECT_GT(deadlocks, 20);
  EXPECT_GT(passes, 20);
}

TEST(Validate, CutsTheGridOfLongSchedules) {
  // GPipe-like, 2 ranks, 40 microbatches, with one backward moved before its forward.
  std::string row0, row1;
  for (int mb = 0; mb < 40; ++mb) row0 += "0F" + std::to_string(mb) + ",";
  for (int mb = 0; mb < 40; ++mb) row1 += "1F" + std::to_string(mb) + ",";
  for (int mb = 0; mb < 40; ++mb) {
    row0 += "0B" + std::to_string(mb) + (mb < 39 ? "," : "");
    row1 += "1B" + std::to_string(mb) + (mb < 39 ? "," : "");
  }
  Schedule s = parse_csv(row0 + "\n" + row1 + "\n");
  EXPECT_NO_THROW(validate(s));
  std::swap(s.actions[1][20], s.actions[1][60]);  // 1B20 to position 20, 1F20 to 60
  ScheduleError e = error_of(s);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 20);
  EXPECT_TRUE(contains(e.what(), "[1B20]")) << e.what();
  EXPECT_TRUE(contains(e.what(), "rank 1 | ... 1F8 ")) << e.what();
  EXPECT_FALSE(contains(e.what(), "1F0 ")) << e.what();
}

// 1F1B of kOneFOneB with each stage's gradients reduced after its last backward.
const char* const kReduced = "0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n";

TEST(Validate, AcceptsReductionsAndLowersAroundThem) {
  const Schedule s = parse_csv(kReduced);
  const ValidatedSchedule ok = validate(s);
  // Lowering leaves the reductions in place: 1B1's send comes before 1REDUCE_GRAD.
  EXPECT_EQ(to_string(ok->actions[1].back()), "1REDUCE_GRAD");
  EXPECT_EQ(to_string(ok->actions[1][ok->actions[1].size() - 2]), "1SEND_B1");
  EXPECT_NO_THROW(validate(*ok));
  // A split backward: the reduction waits for the W's, not the I's.
  EXPECT_NO_THROW(validate(parse_csv("0F0,0I0,0W0,0REDUCE_GRAD\n1F0,1I0,1W0,1REDUCE_GRAD\n")));
}

TEST(Validate, ReductionBeforeALastWeightGradient) {
  ScheduleError e =
      error_of(parse_csv("0F0,0F1,0B0,0REDUCE_GRAD,0B1\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n"));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 3);
  EXPECT_TRUE(contains(e.what(),
                       "rank 0, position 3 (0REDUCE_GRAD): 0REDUCE_GRAD runs before 0B1 "
                       "(position 4), whose weight gradients it reduces"))
      << e.what();
  // With I and W, the W counts.
  e = error_of(parse_csv("0F0,0I0,0REDUCE_GRAD,0W0\n1F0,1I0,1W0,1REDUCE_GRAD\n"));
  EXPECT_EQ(e.position(), 2);
  EXPECT_TRUE(contains(e.message(), "runs before 0W0 (position 3)")) << e.what();
  // Lowered: the same check.
  Schedule lowered = lower(parse_csv(kOneFOneB));
  lowered.actions[1].insert(lowered.actions[1].begin() + 2, parse_action("1REDUCE_GRAD"));
  lowered.actions[0].push_back(parse_action("0REDUCE_GRAD"));
  e = error_of(lowered);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 2);
}

TEST(Validate, ReductionOnTheWrongRankTwiceOrWithAMicrobatch) {
  // (A CSV file places a stage by its actions, so a reduction on another rank is built here.)
  Schedule wrong = parse_csv(kReduced);
  wrong.actions[1].back().stage = 0;
  ScheduleError e = error_of(wrong);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), 4);
  EXPECT_TRUE(contains(e.message(), "stage 0 runs on rank 0")) << e.what();

  e = error_of(
      parse_csv("0F0,0F1,0B0,0REDUCE_GRAD,0B1,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n"));
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 5);
  EXPECT_TRUE(contains(e.message(), "second 0REDUCE_GRAD (the first is at rank 0, position 3)"))
      << e.what();

  Schedule s = parse_csv(kReduced);
  s.actions[0].back().microbatch = 1;
  e = error_of(s);
  EXPECT_EQ(e.position(), 4);
  EXPECT_TRUE(contains(e.message(), "has no microbatch")) << e.what();

  s = parse_csv(kReduced);
  s.actions[1].back().stage = 7;
  e = error_of(s);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(contains(e.message(), "stage 7 is out of range")) << e.what();
}

TEST(Validate, EveryStageReducesOrNoneDoes) {
  const ScheduleError e = error_of(parse_csv("0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F0,1B0,1F1,1B1\n"));
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.position(), -1);
  EXPECT_TRUE(contains(e.what(),
                       "rank 1: stage 1 has no 1REDUCE_GRAD but stage 0 has one (rank "
                       "0, position 4); either every stage reduces its gradients or "
                       "none does"))
      << e.what();
}

TEST(Validate, ReductionInAnAsynchronousScheduleOrAComposite) {
  Schedule s = parse_csv(kReduced);
  s.flushes = false;
  ScheduleError e = error_of(s);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.position(), 4);
  EXPECT_TRUE(contains(e.message(), "needs a synchronous schedule")) << e.what();
  e = error_of(parse_csv("0F0,0F1,0B0,(0B1;0REDUCE_GRAD)OVERLAP_F_B\n1F0,1B0,1F1,1B1\n"));
  EXPECT_EQ(e.position(), 3);
  EXPECT_TRUE(contains(e.message(), "not REDUCE_GRAD")) << e.what();
}

// Replicated stages: each (stage, microbatch) runs where the placement says, messages go between
// the ranks of that microbatch, and the replicas reduce their gradients in one order.
TEST(Validate, ReplicatedSchedules) {
  const Schedule chimera = make_chimera(4, 8);
  EXPECT_NO_THROW(validate(chimera));
  const Schedule lowered = *validate(chimera);
  EXPECT_NO_THROW(validate(lowered));
  EXPECT_NO_THROW(validate(add_grad_reductions(lowered)));
  EXPECT_NO_THROW(validate(make_1f1b_rr({3, 1}, 7)));

  // A placement that sends microbatch 0 of stage 1 to rank 2: rank 1's 1F0 is then misplaced.
  Schedule moved = chimera;
  moved.placement[1][0] = 2;
  ScheduleError e = error_of(moved);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(
      contains(e.message(), "stage 1 microbatch 0 runs on rank 2 (placement), not on rank 1"))
      << e.what();

  // A message received on the wrong rank: 1RECV_F0 belongs to rank 1 (microbatch 0 goes down),
  // not to rank 2, the other replica of stage 1.
  Schedule wrong_receiver = lowered;
  auto& rank1 = wrong_receiver.actions[1];
  const auto recv = std::find(rank1.begin(), rank1.end(), Action::make(Op::RECV_F, 1, 0));
  ASSERT_NE(recv, rank1.end());
  rank1.erase(recv);
  auto& rank2 = wrong_receiver.actions[2];
  rank2.insert(rank2.begin(), Action::make(Op::RECV_F, 1, 0));
  e = error_of(wrong_receiver);
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(e.position(), 0);
  EXPECT_TRUE(contains(e.message(), "runs on rank 1 (placement), not on rank 2")) << e.what();

  // Without that RECV on rank 1, its 1F0 waits for a message nobody receives.
  Schedule no_receiver = lowered;
  auto& list = no_receiver.actions[1];
  list.erase(std::find(list.begin(), list.end(), Action::make(Op::RECV_F, 1, 0)));
  e = error_of(no_receiver);
  EXPECT_TRUE(contains(e.message(), "needs 1RECV_F0 (it receives the input from rank 0)"))
      << e.what();

  // The placement's shape, and stage_to_rank its lowest replica.
  Schedule short_row = chimera;
  short_row.placement[2].pop_back();
  EXPECT_TRUE(contains(error_of(short_row).message(), "placement of stage 2 has 7 entries"));
  Schedule off = chimera;
  off.placement[0][3] = 4;
  EXPECT_TRUE(contains(error_of(off).message(), "is placed on rank 4"));
  Schedule first = chimera;
  first.stage_to_rank[3] = 3;
  EXPECT_TRUE(contains(error_of(first).message(), "its lowest replica is rank 0"));
}

TEST(Validate, ReplicatedReductions) {
  const Schedule reduced = add_grad_reductions(make_chimera(4, 4));
  EXPECT_NO_THROW(validate(reduced));

  // Ranks 0 and 3 both hold stages 0 and 3: reducing them in opposite orders deadlocks.
  Schedule swapped = reduced;
  auto& list = swapped.actions[0];
  const auto reduce3 = std::find(list.begin(), list.end(), Action::make(Op::REDUCE_GRAD, 3, -1));
  ASSERT_NE(reduce3, list.end());
  list.erase(reduce3);
  list.push_back(Action::make(Op::REDUCE_GRAD, 3, -1));  // rank 0: stage 0, then 3; rank 3: 3, 0
  ScheduleError e = error_of(swapped);
  EXPECT_TRUE(contains(e.message(), "deadlock")) << e.what();
  EXPECT_TRUE(contains(e.message(), "on rank 3 reduces stage")) << e.what();

  // Every replica reduces, or none.
  Schedule missing = reduced;
  missing.actions[2].pop_back();
  e = error_of(missing);
  EXPECT_TRUE(contains(e.message(), "on rank 2 but stage")) << e.what();
  EXPECT_NO_THROW(validate(remove_grad_reductions(reduced)));

  // A rank without the stage, and a stage with one replica (1f1b-rr [3, 1]: stage 1).
  Schedule elsewhere = reduced;
  elsewhere.actions[1].push_back(Action::make(Op::REDUCE_GRAD, 0, -1));
  EXPECT_TRUE(contains(error_of(elsewhere).message(), "rank 1 holds no replica of stage 0"));
  Schedule single = add_grad_reductions(make_1f1b_rr({3, 1}, 6));
  EXPECT_NO_THROW(validate(single));
  single.actions[3].push_back(Action::make(Op::REDUCE_GRAD, 1, -1));
  EXPECT_TRUE(contains(error_of(single).message(), "stage 1 has one replica"));
}

}  // namespace
}  // namespace pptrain
