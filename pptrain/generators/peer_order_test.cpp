// The posting of schedule/peer_order.h on the registry's schedules (here, beside the
// generators, since the schedule room may not include them).
#include "pptrain/schedule/peer_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/generators/testing.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

using testing::contains;

ValidatedSchedule one_f_one_b() {
  return validate(make_schedule({"1f1b", /*ranks=*/2, /*microbatches=*/4}));
}

// Each group as "before:ACTION>peer,ACTION>peer", a rank's groups joined by spaces.
std::string groups_text(const ValidatedSchedule& ok, const PeerPosting& posting, int rank) {
  std::string text;
  for (const PostingGroup& group : posting.groups[rank]) {
    text += (text.empty() ? "" : " ") + std::to_string(group.before) + ":";
    for (size_t k = 0; k < group.comms.size(); ++k) {
      text += (k ? "," : "") + to_string(ok->actions[rank][group.comms[k].position]) + ">" +
              std::to_string(group.comms[k].peer);
    }
  }
  return text;
}

// Every SEND and RECV of each rank's list posted once, and the two ends of each pair posting
// the same messages in the same order.
void expect_both_ends_agree(const ValidatedSchedule& ok, const PeerPosting& posting,
                            const std::string& what) {
  const Schedule& s = *ok;
  std::map<std::pair<int, int>, std::vector<size_t>> order;  // (rank, peer) -> messages
  for (int r = 0; r < s.num_ranks; ++r) {
    std::vector<int> posted(s.actions[r].size(), 0);
    for (const PostingGroup& group : posting.groups[r]) {
      for (const PostedComm& comm : group.comms) {
        ++posted[comm.position];
        order[{r, comm.peer}].push_back(message_index(s.actions[r][comm.position], s));
      }
    }
    for (size_t p = 0; p < posted.size(); ++p) {
      EXPECT_EQ(posted[p], is_comm(s.actions[r][p].op) ? 1 : 0)
          << what << ": rank " << r << " position " << p;
    }
  }
  for (const auto& [ends, messages] : order) {
    const std::vector<size_t>& other_end = order[std::make_pair(ends.second, ends.first)];
    EXPECT_EQ(messages, other_end) << what << ": ranks " << ends.first << " and " << ends.second;
  }
}

// The most receives a rank has posted before their RECV's position, at any point of its list.
size_t most_receives_ahead(const ValidatedSchedule& ok, const PeerPosting& posting) {
  size_t most = 0;
  for (int r = 0; r < ok->num_ranks; ++r) {
    const auto& list = ok->actions[r];
    std::vector<int> change(list.size() + 1, 0);  // [position] receives posted - passed there
    for (const PostingGroup& group : posting.groups[r]) {
      for (const PostedComm& comm : group.comms) {
        if (!is_recv(list[comm.position].op)) continue;
        ++change[group.before];
        --change[comm.position + 1];
      }
    }
    int ahead = 0;
    for (int c : change) most = std::max(most, static_cast<size_t>(ahead += c));
  }
  return most;
}

// The runtime's order over Gloo, each message its own group and one receive posted ahead,
// deadlocks under NCCL's rules in 1f1b on two ranks.
TEST(PeerOrder, TodaysPerActionOrderDeadlocksIn1f1b) {
  const ValidatedSchedule ok = one_f_one_b();
  const std::optional<std::string> problem = check_posting(ok, per_action_posting(ok, 1));
  ASSERT_TRUE(problem);
  EXPECT_EQ(*problem,
            "deadlock: rank 0's 0B0 waits for 0RECV_B0 from rank 1, whose 1SEND_B0 rank 1 posts "
            "only after its 1F0, which waits for 1RECV_F0 from rank 0, whose 0SEND_F0 is queued "
            "behind 0RECV_B0 from rank 1 (a circle)");
  // Posting every receive at once does not help: rank 0 queues them ahead of its sends.
  EXPECT_TRUE(check_posting(ok, per_action_posting(ok, -1)));
}

// Rank 0 runs 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 ..., rank 1
// 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 ...: both ends post the pair's
// messages as f0 f1 b0 f2 b1 f3 b2 b3, rank 1 its first two receives at once (rank 0 sends
// both before it needs anything back), the others one action or two ahead of their RECV.
TEST(PeerOrder, NcclPostingOf1f1bOnTwoRanks) {
  const ValidatedSchedule ok = one_f_one_b();
  const PeerPosting posting = nccl_posting(ok);
  EXPECT_EQ(groups_text(ok, posting, 0),
            "1:0SEND_F0>1 3:0SEND_F1>1 4:0RECV_B0>1 7:0SEND_F2>1 8:0RECV_B1>1 11:0SEND_F3>1 "
            "12:0RECV_B2>1 14:0RECV_B3>1");
  EXPECT_EQ(groups_text(ok, posting, 1),
            "0:1RECV_F0>0,1RECV_F1>0 3:1SEND_B0>0 6:1RECV_F2>0 7:1SEND_B1>0 10:1RECV_F3>0 "
            "11:1SEND_B2>0 15:1SEND_B3>0");
  EXPECT_EQ(check_posting(ok, posting), std::nullopt);
  // The data-parallel reductions between its actions change nothing.
  const ValidatedSchedule reduced = validate(add_grad_reductions(*ok));
  EXPECT_EQ(check_posting(reduced, nccl_posting(reduced)), std::nullopt);
}

TEST(PeerOrder, CheckerNamesAMismatch) {
  const ValidatedSchedule ok = one_f_one_b();
  PeerPosting posting = nccl_posting(ok);
  std::vector<PostedComm>& first = posting.groups[1][0].comms;  // 1RECV_F0, 1RECV_F1
  std::swap(first[0], first[1]);
  EXPECT_EQ(check_posting(ok, posting),
            "mismatch: rank 0's 1st send to rank 1 is 0SEND_F0, but rank 1's 1st receive from "
            "rank 0 is 1RECV_F1 (NCCL pairs them by order)");
}

TEST(PeerOrder, CheckerRefusesWhatIsNoPosting) {
  const ValidatedSchedule ok = one_f_one_b();
  const PeerPosting good = nccl_posting(ok);
  const auto problem_of = [&](auto change) {
    PeerPosting posting = good;
    change(posting);
    return check_posting(ok, posting).value_or("fine");
  };
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups.pop_back(); }),
            "the posting has groups for 1 ranks, the schedule 2");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0].pop_back(); }),
            "rank 0 never posts 0RECV_B3 (position 14)");
  EXPECT_EQ(problem_of([](PeerPosting& p) {
              p.groups[0].back().comms.push_back(p.groups[0].front().comms[0]);
            }),
            "rank 0 posts 0SEND_F0 twice (groups 0 and 7)");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0][0].comms[0].peer = 0; }),
            "rank 0 posts 0SEND_F0 to rank 0, but its other end is on rank 1");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0][0].comms[0].position = 0; }),
            "rank 0 posts position 0, which is no SEND or RECV of its list");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0][0].before = 0; }),
            "rank 0 posts 0SEND_F0 before position 0 (0F0), ahead of 0F0 that makes what it "
            "sends");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0][4].before = 6; }),
            "rank 0's group 4 is posted before position 6, ahead of its group 3 before "
            "position 7");
  EXPECT_EQ(problem_of([](PeerPosting& p) { p.groups[0][2].before = 6; }),
            "rank 0 posts 0RECV_B0 before position 6 (0F2), after 0B0 (position 5) that needs it");
}

// The rule passes NCCL's rules on every schedule of the registry, with and without a skip
// connection, at 2, 4 and 8 ranks and with fewer microbatches than ranks where allowed. It posts
// a receive once its message is sent in the reference run: without skips, at 8 ranks and 16
// microbatches, 1f1b holds 2 receives ahead of their RECV at most, bitpipe and wpipe 5 (their
// messages from the last rank back to the first are made well ahead of use); the runtime over
// Gloo posts 4 ahead (ExecutorOptions::recv_ahead). A skip's receives, sent about P actions
// ahead of their use, add to that.
TEST(PeerOrder, NcclPostingRunsEveryRegistrySchedule) {
  size_t checked = 0;
  std::map<std::string, int> made;  // registry name -> sizes made
  for (int p : {2, 4, 8}) {
    testing::for_each_schedule(
        {p}, {p - 1, p, 2 * p}, [&](const Schedule& s, const std::string& what) {
          const ValidatedSchedule ok = validate(s);
          const PeerPosting posting = nccl_posting(ok);
          EXPECT_EQ(check_posting(ok, posting), std::nullopt) << what;
          expect_both_ends_agree(ok, posting, what);
          if (p == 8 && s.num_microbatches == 16 && s.skips.empty()) {
            EXPECT_LE(most_receives_ahead(ok, posting), s.name == "1f1b" ? 2u : 5u) << what;
          }
          ++made[what.substr(0, what.find(" P="))];
          ++checked;
        });
  }
  for (const ScheduleEntry& entry : schedule_registry()) {
    EXPECT_GT(made[entry.name], 0) << entry.name << " was never made";
  }
  EXPECT_GT(checked, 3 * schedule_registry().size());
}

}  // namespace
}  // namespace pptrain
