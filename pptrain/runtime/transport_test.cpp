#include "pptrain/runtime/transport.h"

#include <gtest/gtest.h>

#include <set>

#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/testing.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// A send and the receive it feeds carry the same tag; no two messages of a step share one.
TEST(CommTag, SendsMatchReceivesAndNeverCollide) {
  const int stages = 6, microbatches = 5;
  std::set<int> forward, backward;
  for (int s = 0; s + 1 < stages; ++s) {
    for (int m = 0; m < microbatches; ++m) {
      const int f = comm_tag(Op::SEND_F, s, m, microbatches);
      EXPECT_EQ(f, comm_tag(Op::RECV_F, s + 1, m, microbatches));
      const int b = comm_tag(Op::SEND_B, s + 1, m, microbatches);
      EXPECT_EQ(b, comm_tag(Op::RECV_B, s, m, microbatches));
      EXPECT_TRUE(forward.insert(f).second);
      EXPECT_TRUE(backward.insert(b).second);
      EXPECT_EQ(forward.count(b) + backward.count(f), 0u);
      EXPECT_LT(std::max(f, b), kControlTagBase);
    }
  }
  EXPECT_EQ(comm_peer(Action::make(Op::SEND_F, 2, 0)).stage, 3);
  EXPECT_EQ(comm_peer(Action::make(Op::RECV_F, 2, 0)).stage, 1);
  EXPECT_EQ(comm_peer(Action::make(Op::SEND_B, 2, 0)).stage, 1);
  EXPECT_EQ(comm_peer(Action::make(Op::RECV_B, 2, 0)).stage, 3);
  // Both ends of a message agree on its tag.
  for (Op op : {Op::SEND_F, Op::RECV_F, Op::SEND_B, Op::RECV_B}) {
    const Action a = Action::make(op, 2, 1), peer = comm_peer(a);
    EXPECT_EQ(comm_tag(a.op, a.stage, 1, 4), comm_tag(peer.op, peer.stage, 1, 4)) << to_string(a);
  }
}

// Two ranks (threads of this process) over Gloo: a receive posted before the send, an
// all-reduce and a barrier.
TEST(Transport, GlooSendRecvAllreduceBetweenTwoRanks) {
  const int port = find_free_port();
  std::vector<torch::Tensor> received(2), reduced(2);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    TransportOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.master_port = port;
    options.timeout = std::chrono::seconds(30);
    auto transport = connect_transport(options);
    auto buffer = torch::zeros({3});
    auto posted = transport->recv(buffer, 1 - rank, 7);
    auto sent = transport->send(torch::full({3}, 10.0f + rank), 1 - rank, 7);
    posted.wait();
    sent.wait();
    received[rank] = buffer;
    auto value = torch::full({2}, static_cast<double>(rank + 1), torch::kFloat64);
    transport->allreduce_sum(value);
    reduced[rank] = value;
    transport->barrier();
  });
  ASSERT_EQ(errors, "");
  EXPECT_TRUE(torch::equal(received[0], torch::full({3}, 11.0f)));
  EXPECT_TRUE(torch::equal(received[1], torch::full({3}, 10.0f)));
  for (const auto& r : reduced)
    EXPECT_TRUE(torch::equal(r, torch::full({2}, 3.0, torch::kFloat64)));
}

TEST(Transport, FromEnvNamesWhatIsMissing) {
  unsetenv("RANK");
  try {
    TransportOptions::from_env();
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
  }
}

}  // namespace
}  // namespace pptrain
