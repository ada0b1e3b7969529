#include "pptrain/schedule/schedule.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

TEST(ActionText, RoundTripsEveryOp) {
  for (const char* text : {"0F1", "3I0", "2W5", "1B2", "0SEND_F3", "1RECV_F3", "2SEND_B0",
                           "1RECV_B0", "(0F7;7B3)OVERLAP_F_B", "12F345", "3REDUCE_GRAD"}) {
    EXPECT_EQ(to_string(parse_action(text)), text);
  }
  // A reduction has no microbatch: stored as -1, as torch stores None.
  EXPECT_EQ(parse_action("3REDUCE_GRAD"), Action::make(Op::REDUCE_GRAD, 3, -1));
  EXPECT_TRUE(is_collective(Op::REDUCE_GRAD));
  EXPECT_FALSE(is_comm(Op::REDUCE_GRAD));
  EXPECT_FALSE(is_compute(Op::REDUCE_GRAD));
  EXPECT_EQ(parse_action("2W5"), Action::make(Op::W, 2, 5));
  EXPECT_EQ(parse_action(" 1B2 "), Action::make(Op::B, 1, 2));
}

TEST(ActionText, RejectsMalformedText) {
  for (const char* text : {"", "F1", "0F", "0X1", "0F1x", "(0F1)OVERLAP_F_B", "(0F1;1B0)", "-1F0",
                           "0SEND1", "0REDUCE_GRAD1", "REDUCE_GRAD", "0REDUCE"}) {
    EXPECT_THROW(parse_action(text), UserError) << text;
  }
}

TEST(ScheduleCsv, InfersShapeAndPlacement) {
  // Interleaved placement: stage s on rank s % 2.
  Schedule s = parse_csv("0F0,2F0,,2B0,0B0\n1F0,3F0,3B0,1B0\n");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ(s.chunks(), 2);
  EXPECT_EQ(s.num_microbatches, 1);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(s.actions[0].size(), 4u);  // the empty cell is an idle step, not an action
  EXPECT_EQ(parse_csv(to_csv(s)), s);
}

TEST(ScheduleCsv, DropsTorchsUnshardAndReshardCells) {
  // As torch's lowering writes them around a rank's actions (FSDP), quoted or spaced or not.
  const Schedule s = parse_csv(
      "0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0RESHARD\n"
      "1UNSHARD, 1RECV_F0,1F0,1B0,1SEND_B0,\"1RESHARD\"\n");
  EXPECT_EQ(s, parse_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"));
  // Without a stage number, or with a microbatch, it is no such cell.
  for (const char* text : {"UNSHARD,0F0,0B0\n", "0F0,0B0,0RESHARD1\n", "0F0,0B0,0UNSHARDX\n"}) {
    EXPECT_THROW(parse_csv(text), UserError) << text;
  }
}

TEST(ScheduleCsv, RejectsStageOnTwoRanksAndBadCells) {
  EXPECT_THROW(parse_csv("0F0\n0B0\n"), UserError);
  try {
    parse_csv("0F0,0Q0\n");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 cell 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_csv("1F0\n"), UserError);  // stage 0 missing
}

TEST(ScheduleCsv, HugeStageIndexIsAMessageNotAnAllocation) {
  try {
    parse_csv("0F0,999999999F0,0B0\n");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no action for stage 1"), std::string::npos) << e.what();
  }
}

TEST(Lowering, InsertsSendAfterProducerAndRecvBeforeConsumer) {
  Schedule s = parse_csv("0F0,0B0\n1F0,1B0\n");
  Schedule lowered = lower(s);
  EXPECT_EQ(to_csv(lowered), "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  EXPECT_TRUE(lowered.has_comms());
  EXPECT_EQ(strip_comms(lowered), s);
  EXPECT_EQ(lower(lowered), lowered);
  EXPECT_EQ(parse_csv(to_csv(lowered)), lowered);
}

TEST(Lowering, NoCommunicationBetweenStagesOnOneRank) {
  // V-shape on one rank: stages 0 and 1 both on rank 0.
  Schedule s = parse_csv("0F0,1F0,1B0,0B0\n");
  EXPECT_EQ(lower(s), s);
}

TEST(Schedule, PlacementPerMicrobatch) {
  Schedule s = parse_csv("0F0,1F0,1B0,0B0\n0F1,1F1,1B1,0B1\n");  // each rank runs both stages
  EXPECT_FALSE(s.replicated() && s.placement.empty());
  ASSERT_TRUE(s.replicated());
  EXPECT_EQ(s.rank_of(1, 0), 0);
  EXPECT_EQ(s.rank_of(1, 1), 1);
  EXPECT_EQ(s.replicas_of(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.stages_of(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.chunks(), 2);  // a microbatch runs both stages on its one rank
  EXPECT_EQ(lower(s), s);    // every microbatch stays on its rank: nothing to send
  Schedule other = s;
  other.placement[0][0] = 1;
  EXPECT_FALSE(other == s);  // equality compares the placement

  // Without a placement rank_of is stage_to_rank.
  const Schedule plain = parse_csv("0F0,0B0\n1F0,1B0\n");
  EXPECT_FALSE(plain.replicated());
  EXPECT_EQ(plain.rank_of(1, 0), 1);
  EXPECT_EQ(plain.replicas_of(1), (std::vector<int>{1}));
}

TEST(Schedule, WithoutActionsKeepsEverythingElse) {
  Schedule s = parse_csv("0F0,0F1,1F1,1B1,0B1,0B0\n1F0,1B0\n", "mine");
  s.flushes = false;
  s.skips = {{0, 2}};
  Schedule empty = without_actions(s);
  EXPECT_EQ(empty.name, "mine");
  ASSERT_EQ(empty.actions.size(), 2u);
  EXPECT_TRUE(empty.actions[0].empty() && empty.actions[1].empty());
  empty.actions = s.actions;
  EXPECT_EQ(empty, s);  // shape, placement, skips and flushes all copied
}

TEST(ActionText, CompositesAreSixteenBytesAndEqualWhenTheirPartsAre) {
  static_assert(sizeof(Action) == 16);
  const Action a = Action::overlap({Action::make(Op::F, 0, 1), Action::make(Op::B, 3, 0)});
  const Action same = parse_action("(0F1;3B0)OVERLAP_F_B");
  const Action other = Action::overlap({Action::make(Op::F, 0, 1), Action::make(Op::I, 3, 0)});
  EXPECT_EQ(a, same);
  EXPECT_NE(a, other);
  EXPECT_EQ(to_string(other), "(0F1;3I0)OVERLAP_F_B");
  EXPECT_FALSE(is_skip_message(a));  // its index is no peer stage
  EXPECT_TRUE(Action::make(Op::F, 0, 0).parts().empty());
  ASSERT_EQ(a.parts().size(), 2u);
  EXPECT_EQ(a.parts()[1], Action::make(Op::B, 3, 0));
}

// The parts of composite k of the tests below: a forward and a backward, distinct for every k.
std::vector<Action> parts_of_composite(int k) {
  return {Action::make(Op::F, k % 97, k / 97), Action::make(Op::B, k % 89, 1000 + k)};
}

TEST(ActionText, ManyCompositesKeepTheirPartsAndTheirIdentity) {
  // More than one chunk of the table and several of its growths.
  constexpr int kCount = 20000;
  std::vector<Action> made;
  for (int k = 0; k < kCount; ++k) made.push_back(Action::overlap(parts_of_composite(k)));
  for (int k = 0; k < kCount; ++k) {
    ASSERT_EQ(made[k].parts(), parts_of_composite(k)) << k;
    ASSERT_EQ(Action::overlap(parts_of_composite(k)), made[k]) << k;
    if (k > 0) {
      ASSERT_NE(made[k], made[k - 1]) << k;
    }
  }
  // The same parts in the other order are another composite.
  const auto parts = parts_of_composite(7);
  EXPECT_NE(Action::overlap({parts[1], parts[0]}), made[7]);
}

TEST(ActionText, CompositesMadeOnSeveralThreadsAtOnceAgree) {
  // Four threads intern the same parts in different orders while reading what they made.
  constexpr int kThreads = 4, kCount = 6000;
  std::vector<std::vector<Action>> made(kThreads, std::vector<Action>(kCount));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCount; ++i) {
        const int k = 50000 + (t % 2 == 0 ? i : kCount - 1 - i);
        made[t][k - 50000] = Action::overlap(parts_of_composite(k));
        if (made[t][k - 50000].parts() != parts_of_composite(k)) std::abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(made[t], made[0]);
}

TEST(Lowering, ReplicatedMessagesFollowTheMicrobatch) {
  // Stage 1 on rank 1 for microbatch 0 and on rank 0 for microbatch 1: only microbatch 0 crosses.
  const Schedule s = parse_csv("0F0,0F1,1F1,1B1,0B1,0B0\n1F0,1B0\n");
  EXPECT_EQ(to_csv(lower(s)),
            "0F0,0SEND_F0,0F1,1F1,1B1,0B1,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  const Schedule lowered = lower(s);
  EXPECT_EQ(rank_of_peer(lowered, Action::make(Op::SEND_F, 0, 0)), 1);
  EXPECT_EQ(rank_of_peer(lowered, Action::make(Op::RECV_B, 0, 0)), 1);
  EXPECT_EQ(rank_of_peer(lowered, Action::make(Op::RECV_F, 1, 0)), 0);
  const auto sends_after = [&](const Action& atom) {
    std::vector<Action> sends;
    append_sends_after(atom, lowered, sends);
    return sends;
  };
  EXPECT_TRUE(sends_after(Action::make(Op::F, 0, 1)).empty());
  EXPECT_EQ(sends_after(Action::make(Op::F, 0, 0)),
            std::vector<Action>{Action::make(Op::SEND_F, 0, 0)});
  EXPECT_EQ(inputs_of(Action::make(Op::F, 1, 1), lowered, true).size(), 1u);
  EXPECT_EQ(inputs_of(Action::make(Op::F, 1, 1), lowered, true).begin()->fact, Fact::kOutput);
  EXPECT_EQ(inputs_of(Action::make(Op::F, 1, 0), lowered, true).begin()->fact, Fact::kReceivedF);
}

}  // namespace
}  // namespace pptrain
