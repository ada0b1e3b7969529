#include "pptrain/runtime/loopback_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/group.h"
#include "pptrain/runtime/testing.h"

namespace pptrain {
namespace {

using testing::run_rank_threads;
using namespace std::chrono_literals;

// Short enough that a test which would hang fails in well under its CTest timeout.
constexpr std::chrono::milliseconds kTestTimeout = 5s;

// The message `what()` of what `call` throws, or "" when it returns.
template <typename Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A receive posted before the send (on another thread) gets the data; a send is complete at once.
TEST(LoopbackTransport, SendsAndReceivesAcrossThreads) {
  auto transports = make_loopback_transports(2, kTestTimeout);
  ASSERT_EQ(transports.size(), 2u);
  torch::Tensor received = torch::zeros({2, 3});
  const std::string errors = run_rank_threads(2, [&](int rank) {
    Transport& transport = *transports[rank];
    EXPECT_EQ(transport.rank(), rank);
    EXPECT_EQ(transport.world_size(), 2);
    if (rank == 0) {
      auto posted = transport.recv(received, /*peer=*/1, /*tag=*/5);
      EXPECT_TRUE(posted.pending());
      posted.wait();
      EXPECT_FALSE(posted.pending());
      posted.wait();  // a second wait returns at once
    } else {
      std::this_thread::sleep_for(20ms);  // let rank 0 wait first
      auto sent = transport.send(torch::arange(6, torch::kFloat32).reshape({2, 3}), 0, 5);
      EXPECT_FALSE(sent.pending());
    }
  });
  ASSERT_EQ(errors, "");
  EXPECT_TRUE(torch::equal(received, torch::arange(6, torch::kFloat32).reshape({2, 3})));
}

// A send copies: changing the tensor after send() does not change what arrives.
TEST(LoopbackTransport, SendCopiesTheTensor) {
  auto transports = make_loopback_transports(2, kTestTimeout);
  torch::Tensor value = torch::ones({4});
  transports[1]->send(value, 0, 0).wait();
  value.fill_(7);
  torch::Tensor buffer = torch::zeros({4});
  transports[0]->recv(buffer, 1, 0).wait();
  EXPECT_TRUE(torch::equal(buffer, torch::ones({4})));
}

// Messages of one (source, destination, tag) arrive in the order they were sent, to receives in
// the order they were posted, whatever order those are waited on in; other tags and other sources
// do not get in the way.
TEST(LoopbackTransport, DeliversInOrderPerSourceAndTag) {
  constexpr int kMessages = 6;
  auto transports = make_loopback_transports(3, kTestTimeout);
  std::vector<torch::Tensor> by_tag_a, by_tag_b, from_two;
  const std::string errors = run_rank_threads(3, [&](int rank) {
    Transport& transport = *transports[rank];
    if (rank == 0) {
      std::vector<PendingComm> posted;
      for (int i = 0; i < kMessages; ++i) {
        by_tag_a.push_back(torch::full({1}, -1.0f));
        by_tag_b.push_back(torch::full({1}, -1.0f));
        from_two.push_back(torch::full({1}, -1.0f));
        posted.push_back(transport.recv(by_tag_a.back(), 1, /*tag=*/1));
        posted.push_back(transport.recv(by_tag_b.back(), 1, /*tag=*/2));
        posted.push_back(transport.recv(from_two.back(), 2, /*tag=*/1));
      }
      for (auto it = posted.rbegin(); it != posted.rend(); ++it) it->wait();
    } else {
      // Rank 1 sends tag 2's stream before tag 1's; rank 2 uses tag 1 as well.
      for (int tag : {2, 1}) {
        for (int i = 0; i < kMessages; ++i) {
          transport.send(torch::full({1}, 100.0f * rank + 10.0f * tag + i), 0, tag);
        }
      }
    }
  });
  ASSERT_EQ(errors, "");
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(by_tag_a[i].item<float>(), 110.0f + i);
    EXPECT_EQ(by_tag_b[i].item<float>(), 120.0f + i);
    EXPECT_EQ(from_two[i].item<float>(), 210.0f + i);
  }
}

// A receive whose send never comes fails after the timeout, naming both ranks, the tag and the
// timeout; it does not hang.
TEST(LoopbackTransport, ReceiveWithoutSendTimesOutNamingRankPeerAndTag) {
  auto transports = make_loopback_transports(2, 150ms);
  torch::Tensor buffer = torch::zeros({3});
  transports[0]->send(torch::ones({3}), 1, /*tag=*/8);  // another tag: not a match
  auto posted = transports[1]->recv(buffer, 0, /*tag=*/9);
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { posted.wait(); });
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(contains(error, "rank 1: receive from rank 0 with tag 9 timed out after 150 ms"))
      << error;
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 2s);
}

// A message of another shape than the receive buffer is an error, not a silent reshape.
TEST(LoopbackTransport, ShapeMismatchIsAnError) {
  auto transports = make_loopback_transports(2, kTestTimeout);
  transports[0]->send(torch::ones({3}), 1, 0);
  torch::Tensor buffer = torch::zeros({4});
  const std::string error = error_of([&] { transports[1]->recv(buffer, 0, 0).wait(); });
  EXPECT_TRUE(contains(error, "rank 1: the message from rank 0 with tag 0 is float [3]")) << error;
}

// Each rank's thread calls allreduce_sum; all get the sum, round after round.
TEST(LoopbackTransport, AllreduceSumsOverRankThreads) {
  constexpr int kRanks = 4, kRounds = 20;
  auto transports = make_loopback_transports(kRanks, kTestTimeout);
  const std::string errors = run_rank_threads(kRanks, [&](int rank) {
    for (int round = 0; round < kRounds; ++round) {
      auto value = torch::full({3}, static_cast<double>(rank + 1 + round), torch::kFloat64);
      transports[rank]->allreduce_sum(value);
      // (1 + 2 + 3 + 4) + 4 * round
      const double want = 10.0 + kRanks * round;
      EXPECT_TRUE(torch::equal(value, torch::full({3}, want, torch::kFloat64)))
          << "rank " << rank << " round " << round << ": " << value;
    }
  });
  EXPECT_EQ(errors, "");
}

// No rank leaves a barrier before every rank has entered it.
TEST(LoopbackTransport, BarrierHoldsEveryRankUntilAllArrive) {
  constexpr int kRanks = 3, kRounds = 10;
  auto transports = make_loopback_transports(kRanks, kTestTimeout);
  std::atomic<int> entered{0};
  const std::string errors = run_rank_threads(kRanks, [&](int rank) {
    for (int round = 0; round < kRounds; ++round) {
      if (rank == round % kRanks) std::this_thread::sleep_for(2ms);  // a late rank each round
      ++entered;
      transports[rank]->barrier();
      EXPECT_GE(entered.load(), kRanks * (round + 1)) << "rank " << rank << " round " << round;
    }
  });
  EXPECT_EQ(errors, "");
}

// A collective that a rank never joins fails on the others after the timeout, naming it.
TEST(LoopbackTransport, CollectiveTimesOutNamingTheMissingRanks) {
  auto transports = make_loopback_transports(3, 100ms);
  const std::string errors = run_rank_threads(2, [&](int rank) { transports[rank]->barrier(); });
  EXPECT_TRUE(contains(errors, "rank 0: barrier timed out after 100 ms waiting for rank(s) 2"))
      << errors;
  EXPECT_TRUE(contains(errors, "rank 1: barrier timed out after 100 ms waiting for rank(s) 2"))
      << errors;
}

// World size 1 (a one-process run): messages to itself, a trivial all-reduce and barrier.
TEST(LoopbackTransport, OneRankTalksToItself) {
  auto transports = make_loopback_transports(1);
  Transport& transport = *transports.at(0);
  EXPECT_EQ(transport.world_size(), 1);
  torch::Tensor buffer = torch::zeros({2});
  auto posted = transport.recv(buffer, 0, 3);
  transport.send(torch::full({2}, 4.0f), 0, 3);
  posted.wait();
  EXPECT_TRUE(torch::equal(buffer, torch::full({2}, 4.0f)));
  auto value = torch::full({2}, 1.5);
  transport.allreduce_sum(value);
  EXPECT_TRUE(torch::equal(value, torch::full({2}, 1.5)));
  transport.barrier();
}

TEST(LoopbackTransport, RejectsAnEmptyWorld) {
  EXPECT_THROW(make_loopback_transports(0), UserError);
}

}  // namespace
}  // namespace pptrain

namespace pptrain {
namespace {

// A placed transport (group.h) over three loopback ranks: rank r is process process_of[r]; a
// message to rank 1 reaches the process that plays it, and a subgroup of ranks {0, 2} has
// their positions as its ranks.
TEST(PlacedTransport, RanksArePlacedAndSoAreSubgroups) {
  const std::vector<int> process_of = {2, 0, 1};
  auto processes = make_loopback_transports(3, kTestTimeout);
  std::vector<std::unique_ptr<Transport>> placed(3);
  for (int p = 0; p < 3; ++p) placed[p] = placed_transport(std::move(processes[p]), process_of);
  std::vector<int> rank_of_process(3, -1);
  std::vector<float> got(3, -1);
  const std::string errors = run_rank_threads(3, [&](int process) {
    Transport& t = *placed[process];
    rank_of_process[process] = t.rank();
    // Each rank sends its rank to the next one.
    torch::Tensor in = torch::zeros({1});
    auto posted = t.recv(in, (t.rank() + 2) % 3, 7);
    t.send(torch::full({1}, static_cast<float>(t.rank())), (t.rank() + 1) % 3, 7).wait();
    posted.wait();
    got[t.rank()] = in.item<float>();
    if (t.rank() != 1) {
      std::unique_ptr<Transport> pair = t.subgroup({0, 2});
      EXPECT_EQ(pair->rank(), t.rank() == 0 ? 0 : 1);
      torch::Tensor x = torch::full({1}, t.rank() == 0 ? 1.0f : 10.0f);
      torch::Tensor from = torch::zeros({1});
      auto other = pair->recv(from, 1 - pair->rank(), 3);
      pair->send(x, 1 - pair->rank(), 3).wait();
      other.wait();
      EXPECT_EQ(from.item<float>(), t.rank() == 0 ? 10.0f : 1.0f);
      pair->allreduce_sum(x);
      EXPECT_EQ(x.item<float>(), 11.0f);
    }
  });
  ASSERT_EQ(errors, "");
  EXPECT_EQ(rank_of_process, (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(got, (std::vector<float>{2, 0, 1}));
}

// A placed view leaves the processes' transports with their owner, which places them anew: two
// processes swap ranks, then swap back, and each message reaches the process playing its rank.
TEST(PlacedTransport, AViewIsPlacedAnewOverTheSameProcesses) {
  auto processes = make_loopback_transports(2, kTestTimeout);
  std::vector<std::vector<int>> ranks_of_process(2);
  const std::string errors = run_rank_threads(2, [&](int process) {
    for (const std::vector<int>& process_of : {std::vector<int>{1, 0}, std::vector<int>{0, 1}}) {
      std::unique_ptr<Transport> t = placed_view(*processes[process], process_of);
      ranks_of_process[process].push_back(t->rank());
      torch::Tensor in = torch::zeros({1});
      auto posted = t->recv(in, 1 - t->rank(), 5);
      t->send(torch::full({1}, static_cast<float>(process)), 1 - t->rank(), 5).wait();
      posted.wait();
      EXPECT_EQ(in.item<float>(), static_cast<float>(1 - process));
    }
  });
  ASSERT_EQ(errors, "");
  EXPECT_EQ(ranks_of_process, (std::vector<std::vector<int>>{{1, 0}, {0, 1}}));
}

}  // namespace
}  // namespace pptrain
