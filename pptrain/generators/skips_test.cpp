// Skip connections in the schedule (schedule.h: Schedule::skips): their actions' text, lowering,
// the CSV form, the message numbering and the validator's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "pptrain/generators/registry.h"
#include "pptrain/generators/testing.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

using testing::contains;

ScheduleError error_of(const Schedule& schedule) {
  return testing::validation_error(schedule);
}

// GPipe on three ranks, one microbatch, with a skip from stage 0 to stage 2.
Schedule gpipe_with_skip() {
  Schedule s = parse_csv("0F0,0B0\n1F0,1B0\n2F0,2B0\n");
  s.skips = {{0, 2}};
  return s;
}

void erase_action(std::vector<Action>& list, const std::string& text) {
  const auto it = std::find(list.begin(), list.end(), parse_action(text));
  ASSERT_NE(it, list.end()) << text;
  list.erase(it);
}

TEST(SkipActions, TextNamesThePeerStage) {
  for (const char* text : {"0SEND_F3>2", "2RECV_F3<0", "2SEND_B3>0", "0RECV_B3<2"}) {
    const Action a = parse_action(text);
    EXPECT_TRUE(is_skip_message(a)) << text;
    EXPECT_EQ(to_string(a), text);
  }
  EXPECT_EQ(parse_action("0SEND_F3>2"), Action::skip(Op::SEND_F, 0, 3, 2));
  EXPECT_EQ(comm_peer(parse_action("0SEND_F3>2")), parse_action("2RECV_F3<0"));
  EXPECT_EQ(comm_peer(parse_action("2SEND_B3>0")), parse_action("0RECV_B3<2"));
  EXPECT_NE(parse_action("0SEND_F3>2"), parse_action("0SEND_F3"));
  // The arrow points the way the message goes; compute actions have no peer.
  for (const char* bad : {"0SEND_F3<2", "2RECV_F3>0", "0F3>2", "0SEND_F3>", "0SEND_F3>x"}) {
    EXPECT_THROW(parse_action(bad), UserError) << bad;
  }
}

TEST(SkipActions, LoweringAddsAMessageEachWayAcrossRanks) {
  const Schedule lowered = lower(gpipe_with_skip());
  EXPECT_EQ(to_csv(lowered),
            "0F0,0SEND_F0,0SEND_F0>2,0RECV_B0,0RECV_B0<2,0B0\n"
            "1RECV_F0,1F0,1SEND_F0,1RECV_B0,1B0,1SEND_B0\n"
            "2RECV_F0,2RECV_F0<0,2F0,2B0,2SEND_B0,2SEND_B0>0\n");
  // The CSV carries the skips: read back, it is the same schedule.
  EXPECT_EQ(parse_csv(to_csv(lowered)), lowered);
  EXPECT_NO_THROW(validate(lowered));
  // On one rank the tensor is handed over: no message.
  Schedule one_rank = parse_csv("0F0,1F0,2F0,2B0,1B0,0B0\n");
  one_rank.skips = {{0, 2}};
  EXPECT_EQ(lower(one_rank).actions, one_rank.actions);
  EXPECT_NO_THROW(validate(one_rank));
}

TEST(SkipActions, EveryMessageHasItsOwnIndex) {
  Schedule s = make_schedule({"1f1b", 4, 3});
  s.skips = {{0, 2}, {0, 3}, {1, 3}};
  const Schedule lowered = lower(s);
  std::set<size_t> sent, received;
  for (const auto& list : lowered.actions) {
    for (const Action& a : list) {
      if (is_send(a.op)) {
        EXPECT_TRUE(sent.insert(message_index(a, lowered)).second) << to_string(a);
      }
      if (is_recv(a.op)) received.insert(message_index(a, lowered));
    }
  }
  EXPECT_EQ(sent, received);
  // Every message of the step: 3 cuts and 3 skips, both ways, for 3 microbatches.
  EXPECT_EQ(sent.size(), message_count(lowered));
  EXPECT_EQ(message_count(lowered), 2u * (3 + 3) * 3);
  EXPECT_LT(*sent.rbegin(), message_count(lowered));
}

// A skip from the first stage to the last on every synchronous schedule: lowered, it validates,
// and each microbatch has the skip's four actions where the two stages are on different ranks.
TEST(SkipActions, EverySynchronousScheduleLowersAndValidatesWithASkip) {
  for (const ScheduleEntry& entry : schedule_registry()) {
    if (entry.asynchronous()) continue;
    for (int ranks : {2, 4}) {
      ScheduleOptions request{entry.name, ranks, 2 * ranks};
      Schedule s;
      try {
        s = make_schedule(request);
      } catch (const UserError&) {
        continue;  // this schedule does not come in this size
      }
      if (s.num_stages < 3) continue;
      s.skips = {{0, s.num_stages - 1}};
      const std::string what = entry.name + " on " + std::to_string(ranks) + " ranks";
      ValidatedSchedule validated = validate(s);
      size_t skip_actions = 0, expected = 0;
      for (const auto& list : validated->actions) {
        skip_actions += std::count_if(list.begin(), list.end(), is_skip_message);
      }
      for (int m = 0; m < s.num_microbatches; ++m) {
        expected += s.rank_of(0, m) != s.rank_of(s.num_stages - 1, m) ? 4 : 0;
      }
      EXPECT_EQ(skip_actions, expected) << what;
      // The CSV knows a skip from its messages: a V shape, which holds both ends on rank 0, has
      // none.
      if (expected > 0) {
        EXPECT_EQ(parse_csv(to_csv(*validated)).skips, s.skips) << what;
      }
    }
  }
}

TEST(SkipActions, ASkipSendWithoutItsReceiveIsRefused) {
  // The receive is gone from rank 2: its forward waits for a message that never comes.
  Schedule no_recv = lower(gpipe_with_skip());
  erase_action(no_recv.actions[2], "2RECV_F0<0");
  ScheduleError e = error_of(parse_csv(to_csv(no_recv)));
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(to_string(no_recv.actions[2][e.position()]), "2F0") << e.what();
  EXPECT_TRUE(contains(e.message(),
                       "needs 2RECV_F0<0 (it receives the skip connection's input "
                       "from rank 0), but the schedule has none"))
      << e.what();
  // The send is gone: the receive on rank 2 has no partner.
  Schedule no_send = lower(gpipe_with_skip());
  erase_action(no_send.actions[0], "0SEND_F0>2");
  e = error_of(no_send);
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(to_string(no_send.actions[2][e.position()]), "2RECV_F0<0");
  EXPECT_TRUE(contains(e.message(), "no matching 0SEND_F0>2 on rank 0")) << e.what();
  // The gradient's receive is gone: the send of rank 2 has no receiver... and rank 0's
  // backward no gradient.
  Schedule no_grad = lower(gpipe_with_skip());
  erase_action(no_grad.actions[0], "0RECV_B0<2");
  e = error_of(no_grad);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_TRUE(contains(e.message(), "needs 0RECV_B0<2")) << e.what();
}

TEST(SkipActions, SkipMessagesOfNoSkipAndBadSkipsAreRefused) {
  // A skip message between stages the schedule has no skip for.
  Schedule undeclared = lower(gpipe_with_skip());
  undeclared.skips.clear();
  ScheduleError e = error_of(undeclared);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_TRUE(contains(e.message(),
                       "stage 0 has no skip connection to later stage 2 (the "
                       "schedule's skips: none)"))
      << e.what();
  // A message that goes the wrong way.
  Schedule backwards = lower(gpipe_with_skip());
  std::replace(backwards.actions[0].begin(), backwards.actions[0].end(), parse_action("0SEND_F0>2"),
               Action::skip(Op::SEND_B, 0, 0, 2));
  e = error_of(backwards);
  EXPECT_TRUE(contains(e.message(), "stage 0 has no skip connection from earlier stage 2"))
      << e.what();
  // Skips must pass a stage, and be listed once.
  Schedule adjacent = gpipe_with_skip();
  adjacent.skips = {{0, 1}};
  EXPECT_TRUE(contains(error_of(adjacent).message(), "a skip from stage 0 to stage 1"));
  Schedule twice = gpipe_with_skip();
  twice.skips = {{0, 2}, {0, 2}};
  EXPECT_TRUE(contains(error_of(twice).message(), "not sorted and distinct"));
}

TEST(SkipActions, AGradientAwaitedBeforeItsActivationIsSentIsADeadlock) {
  // Rank 0 waits for the skip's gradient before it sends the skip's activation, which rank 2's
  // forward (and so that gradient) needs.
  Schedule s = lower(gpipe_with_skip());
  auto& rank0 = s.actions[0];
  erase_action(rank0, "0RECV_B0<2");
  rank0.insert(rank0.begin() + 1, parse_action("0RECV_B0<2"));
  const ScheduleError e = error_of(s);
  EXPECT_TRUE(contains(e.message(), "deadlock")) << e.what();
  EXPECT_TRUE(contains(e.message(), "rank 0 waits at position 1 (0RECV_B0<2) for 2SEND_B0>0"))
      << e.what();
}

}  // namespace
}  // namespace pptrain
