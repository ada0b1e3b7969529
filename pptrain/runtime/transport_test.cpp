#include "pptrain/runtime/transport.h"

#include <gtest/gtest.h>

#include <set>

#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/testing.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// A send and the receive at its other end carry the same tag; no two messages of a step share
// one, and all stay below the control tags.
TEST(MessageTag, BothEndsAgreeAndMessagesNeverShare) {
  const int stages = 6, microbatches = 5;
  std::set<int> tags;
  for (int s = 0; s < stages; ++s) {
    for (int m = 0; m < microbatches; ++m) {
      for (Op op : {Op::SEND_F, Op::SEND_B}) {
        if ((op == Op::SEND_F && s + 1 == stages) || (op == Op::SEND_B && s == 0)) continue;
        const Action send = Action::make(op, s, m);
        const int tag = message_tag(send, stages, microbatches);
        EXPECT_EQ(tag, message_tag(comm_peer(send), stages, microbatches)) << to_string(send);
        EXPECT_TRUE(tags.insert(tag).second) << to_string(send);
        EXPECT_GE(tag, 0);
        EXPECT_LT(tag, kControlTagBase);
      }
    }
  }
  EXPECT_EQ(tags.size(), message_count(stages, microbatches));
}

TEST(MessageTag, TooManyMessagesForTheTagsIsAUserError) {
  try {
    message_tag(Action::make(Op::SEND_F, 0, 0), /*num_stages=*/1 << 16,
                /*num_microbatches=*/1 << 14);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("65536 stages and 16384 microbatches"), std::string::npos)
        << e.what();
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
