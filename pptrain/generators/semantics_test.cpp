#include "pptrain/schedule/semantics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/generators/testing.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

std::vector<Need> needs_of(const char* text, const std::vector<int>& placement, bool lowered) {
  const Needs needs = inputs_of(parse_action(text), placement, lowered);
  return {needs.begin(), needs.end()};
}

TEST(Semantics, CommPeerIsTheOtherEnd) {
  EXPECT_EQ(comm_peer(parse_action("2SEND_F5")), parse_action("3RECV_F5"));
  EXPECT_EQ(comm_peer(parse_action("2RECV_F5")), parse_action("1SEND_F5"));
  EXPECT_EQ(comm_peer(parse_action("2SEND_B5")), parse_action("1RECV_B5"));
  EXPECT_EQ(comm_peer(parse_action("2RECV_B5")), parse_action("3SEND_B5"));
  EXPECT_THROW(comm_peer(parse_action("2F5")), InternalError);
}

TEST(Semantics, BothEndsCarryOneMessageAndEveryMessageHasItsOwnIndex) {
  const int S = 4, M = 3;
  std::set<size_t> seen;
  for (Op op : {Op::SEND_F, Op::SEND_B, Op::RECV_F, Op::RECV_B}) {
    for (int s = 0; s < S; ++s) {
      for (int m = 0; m < M; ++m) {
        const Action a = Action::make(op, s, m);
        const bool exists = (op == Op::SEND_F || op == Op::RECV_B) ? s + 1 < S : s > 0;
        if (!exists) continue;
        EXPECT_EQ(message_of(a), message_of(comm_peer(a))) << to_string(a);
        const size_t index = message_index(message_of(a), S, M);
        EXPECT_LT(index, message_count(S, M));
        if (op == Op::SEND_F || op == Op::SEND_B) {
          EXPECT_TRUE(seen.insert(index).second) << to_string(a);
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), message_count(S, M));
}

TEST(Semantics, InputsFollowTheTable) {
  const std::vector<int> v_shape = {0, 1, 1, 0};  // stages 0 and 3 on rank 0, 1 and 2 on rank 1
  // A forward waits for the previous stage's output, through a RECV across ranks when lowered.
  EXPECT_EQ(needs_of("1F2", v_shape, true), (std::vector<Need>{{Fact::kReceivedF, 1, 2}}));
  EXPECT_EQ(needs_of("1F2", v_shape, false), (std::vector<Need>{{Fact::kOutput, 0, 2}}));
  EXPECT_EQ(needs_of("2F2", v_shape, true), (std::vector<Need>{{Fact::kOutput, 1, 2}}));
  EXPECT_TRUE(needs_of("0F0", v_shape, true).empty());
  // A backward waits for its forward and the next stage's input gradient; the last stage only
  // for its forward. I and B mean the same here.
  EXPECT_EQ(needs_of("1I0", v_shape, true),
            (std::vector<Need>{{Fact::kOutput, 1, 0}, {Fact::kInputGrad, 2, 0}}));
  EXPECT_EQ(needs_of("2B0", v_shape, true),
            (std::vector<Need>{{Fact::kOutput, 2, 0}, {Fact::kReceivedB, 2, 0}}));
  EXPECT_EQ(needs_of("3I0", v_shape, true), (std::vector<Need>{{Fact::kOutput, 3, 0}}));
  EXPECT_EQ(needs_of("3W1", v_shape, true), (std::vector<Need>{{Fact::kInputGrad, 3, 1}}));
  // Communication: a send waits for what it sends, a receive for the send.
  EXPECT_EQ(needs_of("0SEND_F1", v_shape, true), (std::vector<Need>{{Fact::kOutput, 0, 1}}));
  EXPECT_EQ(needs_of("3SEND_B1", v_shape, true), (std::vector<Need>{{Fact::kInputGrad, 3, 1}}));
  EXPECT_EQ(needs_of("1RECV_F1", v_shape, true), (std::vector<Need>{{Fact::kSentF, 0, 1}}));
  EXPECT_EQ(needs_of("2RECV_B1", v_shape, true), (std::vector<Need>{{Fact::kSentB, 3, 1}}));
}

TEST(Semantics, EveryNeedIsProducedByItsProducer) {
  const std::vector<int> placement = {0, 1, 0, 1};
  for (const char* text : {"1F0", "2I1", "3W0", "1SEND_F0", "2SEND_B1", "1RECV_F0", "2RECV_B1"}) {
    for (const Need& need : inputs_of(parse_action(text), placement, true)) {
      EXPECT_EQ(produced_by(producer_of(need)), need) << text;
    }
  }
}

TEST(Semantics, SendsFollowWhatLeavesTheRank) {
  const std::vector<int> placement = {0, 1, 1, 0};
  EXPECT_EQ(send_after(parse_action("0F0"), placement), parse_action("0SEND_F0"));
  EXPECT_FALSE(send_after(parse_action("1F0"), placement));  // stage 2 is on the same rank
  EXPECT_EQ(send_after(parse_action("2I0"), placement), std::nullopt);
  EXPECT_EQ(send_after(parse_action("1B0"), placement), parse_action("1SEND_B0"));
  EXPECT_FALSE(send_after(parse_action("3F0"), placement));  // the last stage sends nothing on
  EXPECT_FALSE(send_after(parse_action("3W0"), placement));
}

TEST(Semantics, AtomsOfACompositeAreItsParts) {
  const Action both = parse_action("(0F7;1B3)OVERLAP_F_B");
  std::vector<Action> atoms;
  for (const Action& a : atoms_of(both)) atoms.push_back(a);
  EXPECT_EQ(atoms, both.parts());
  const Action plain = parse_action("0F1");
  EXPECT_EQ(std::distance(atoms_of(plain).begin(), atoms_of(plain).end()), 1);
}

TEST(Semantics, AReductionWaitsForNoNeedSendsNothingAndCarriesNoMessage) {
  const std::vector<int> placement = {0, 1};
  const Action reduce = parse_action("1REDUCE_GRAD");
  EXPECT_EQ(inputs_of(reduce, placement, /*lowered=*/true).size(), 0u);
  EXPECT_FALSE(send_after(reduce, placement));
  EXPECT_THROW(message_of(reduce), InternalError);
  EXPECT_THROW(produced_by(reduce), InternalError);
  // What it waits for instead: every W or B of its stage.
  EXPECT_TRUE(computes_weight_grads(Op::W));
  EXPECT_TRUE(computes_weight_grads(Op::B));
  EXPECT_FALSE(computes_weight_grads(Op::I));
  EXPECT_FALSE(computes_weight_grads(Op::REDUCE_GRAD));
}

}  // namespace
}  // namespace pptrain

namespace pptrain {
namespace {

// After any step, every rank of an asynchronous schedule can stop (to save a checkpoint)
// without waiting for another's later work: the runs that --save-every accepts. WPipe's
// interleaved groups on 4 ranks are the exception --save-every refuses.
TEST(Semantics, AsynchronousRunsCanStopAfterEveryStep) {
  for (const ScheduleEntry& entry : schedule_registry()) {
    if (!entry.asynchronous() || entry.name == "wpipe") continue;
    for (int ranks : {1, 2, 3, 4, 6, 8}) {
      for (int per_step : {1, 2, 4, 8}) {
        ScheduleOptions options{entry.name, ranks, 3 * per_step};
        options.period = per_step;
        EXPECT_EQ(first_crossed_step(lower(make_schedule(options)), per_step), -1)
            << entry.name << " on " << ranks << " ranks, " << per_step << " microbatches a step";
      }
    }
  }
  ScheduleOptions wpipe{"wpipe", 4, 12};
  wpipe.period = 4;
  EXPECT_EQ(first_crossed_step(lower(make_schedule(wpipe)), 4), 0);
  wpipe.ranks = 2;
  EXPECT_EQ(first_crossed_step(lower(make_schedule(wpipe)), 4), -1);
}

// send_releases() against its rule read literally: for each SEND, scan the rank's later RECVs
// for the first from the message's receiver whose SEND there comes after that receiver's RECV.
std::map<size_t, std::vector<size_t>> releases_by_scan(const Schedule& lowered, int rank) {
  std::vector<std::pair<int, size_t>> sent(message_count(lowered)), received(sent.size());
  for (int r = 0; r < lowered.num_ranks; ++r) {
    for (size_t p = 0; p < lowered.actions[r].size(); ++p) {
      const Action& a = lowered.actions[r][p];
      if (is_send(a.op)) sent[message_index(a, lowered)] = {r, p};
      if (is_recv(a.op)) received[message_index(a, lowered)] = {r, p};
    }
  }
  std::map<size_t, std::vector<size_t>> out;
  const auto& mine = lowered.actions[rank];
  for (size_t p = 0; p < mine.size(); ++p) {
    if (!is_send(mine[p].op)) continue;
    const auto [to, there] = received[message_index(mine[p], lowered)];
    for (size_t q = p + 1; q < mine.size(); ++q) {
      if (!is_recv(mine[q].op)) continue;
      const auto [from, sent_at] = sent[message_index(mine[q], lowered)];
      if (from == to && sent_at > there) {
        out[q].push_back(p);
        break;
      }
    }
  }
  return out;
}

// Both forms of the rule (the executor's map, the memory walk's pairs) give the scan's releases.
TEST(Semantics, SendsAreReleasedAfterTheFirstReceiveThatProvesTheirArrival) {
  int compared = 0, released = 0;
  testing::for_each_schedule(
      {2, 3, 4, 8}, {1, 4, 9, 16}, [&](const Schedule& made, const std::string& what) {
        const ValidatedSchedule lowered = validate(made);
        const auto pairs = send_release_pairs(*lowered);
        for (int r = 0; r < made.num_ranks; ++r) {
          const auto expected = releases_by_scan(*lowered, r);
          EXPECT_EQ(send_releases(*lowered, r), expected) << what << " rank " << r;
          std::map<size_t, std::vector<size_t>> from_pairs;
          for (const auto& [recv, send] : pairs[r]) from_pairs[recv].push_back(send);
          EXPECT_EQ(from_pairs, expected) << what << " rank " << r;
          EXPECT_TRUE(std::is_sorted(pairs[r].begin(), pairs[r].end()));
          ++compared;
          released += static_cast<int>(expected.size());
        }
      });
  EXPECT_GT(compared, 1000);
  EXPECT_GT(released, 1000);  // the rule releases most sends after a receive, not at the end
}

// Step k's segment ends after the rank's last action on a microbatch of steps 0..k.
TEST(Semantics, StepSegmentsEndAfterTheStepsLastAction) {
  ScheduleOptions options{"pipedream", 2, 4};
  options.period = 2;
  const Schedule s = make_schedule(options);
  for (int r = 0; r < 2; ++r) {
    const std::vector<size_t> ends = step_segment_ends(s, r, 2);
    ASSERT_EQ(ends.size(), 2u);
    EXPECT_EQ(ends[1], s.actions[r].size());
    const auto& mine = s.actions[r];
    // The last action of segment 0 is on step 0; no later one is.
    ASSERT_GT(ends[0], 0u);
    EXPECT_LT(mine[ends[0] - 1].microbatch, 2) << to_string(mine[ends[0] - 1]);
    for (size_t p = ends[0]; p < mine.size(); ++p) EXPECT_GE(mine[p].microbatch, 2);
  }
}

}  // namespace
}  // namespace pptrain
