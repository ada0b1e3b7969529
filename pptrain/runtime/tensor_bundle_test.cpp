#include "pptrain/runtime/tensor_bundle.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/testing.h"

namespace pptrain {
namespace {

using namespace std::chrono_literals;

// A transport that counts the sends it passes on: how many transfers a message took.
class CountingTransport : public Transport {
 public:
  explicit CountingTransport(Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  PendingComm send(const torch::Tensor& tensor, int peer, int tag) override {
    ++sends;
    return inner_.send(tensor, peer, tag);
  }
  PendingComm recv(const torch::Tensor& buffer, int peer, int tag) override {
    return inner_.recv(buffer, peer, tag);
  }
  PendingComm allreduce_sum_async(const torch::Tensor& tensor) override {
    return inner_.allreduce_sum_async(tensor);
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members) override {
    return inner_.subgroup(members);
  }
  std::unique_ptr<Transport> independent(const std::string& name) override {
    return inner_.independent(name);
  }
  LinkKind link_to(int peer) const override { return inner_.link_to(peer); }
  int sends = 0;

 private:
  Transport& inner_;
};

bool same_bundle(const TensorBundle& a, const TensorBundle& b) {
  if (a.size() != b.size() || a.names() != b.names()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && (a[i].scalar_type() != b[i].scalar_type() || !torch::equal(a[i], b[i])))
      return false;
  }
  return true;
}

// One tag's messages of changing lengths, dtypes and kinds arrive whole and in order; a message
// as long as the tag's last one takes one transfer, any other a notice and the message.
TEST(BundleMessages, LengthsChangeOnOneTagAndARepeatedLengthTakesOneTransfer) {
  const torch::Tensor hidden = torch::randn({4, 8});
  const std::vector<TensorBundle> messages = {
      TensorBundle({{"hidden", hidden},
                    {"positions", torch::arange(4, torch::kInt64)},
                    {"mask", torch::tensor({true, false, true, true})}}),
      TensorBundle({{"hidden", hidden * 2},
                    {"positions", torch::arange(4, 8, torch::kInt64)},
                    {"mask", torch::tensor({false, false, true, true})}}),
      TensorBundle({{"hidden", torch::randn({6, 8})},
                    {"positions", torch::arange(6, torch::kInt64)},
                    {"mask", torch::ones({6}, torch::kBool)}}),
      TensorBundle(),
      TensorBundle(std::vector<torch::Tensor>{torch::Tensor(),
                                              torch::randn({3, 2}).to(torch::kBFloat16),
                                              torch::randn({5, 3}).t()}),  // not contiguous
  };
  const std::vector<int> transfers = {2, 1, 2, 2, 2};
  auto transports = make_loopback_transports(2, 5s);
  CountingTransport counting(*transports[1]);
  std::vector<TensorBundle> received;
  std::vector<int> sends;
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    MessageLengths lengths;
    for (const TensorBundle& message : messages) {
      if (rank == 1) {
        const int before = counting.sends;
        int64_t bytes = 0;
        send_bundle(counting, message, /*peer=*/0, /*tag=*/7, lengths, &bytes).wait();
        sends.push_back(counting.sends - before);
        EXPECT_EQ(bytes, bundle_bytes(message));
      } else {
        received.push_back(
            BundleReceive(*transports[0], 1, 7, "the test's message", lengths).finish());
      }
    }
  });
  ASSERT_EQ(errors, "");
  EXPECT_EQ(sends, transfers);
  ASSERT_EQ(received.size(), messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_TRUE(same_bundle(received[i], messages[i]))
        << "message " << i << ": " << received[i].describe();
  }
}

// Bytes that are not a message of ours fail the receive with one line naming it.
TEST(BundleMessages, AForeignMessageIsRefusedNamingIt) {
  auto transports = make_loopback_transports(2, 5s);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    MessageLengths lengths;
    if (rank == 1) {
      transports[1]->send(torch::ones({64}, torch::kUInt8), 0, 3).wait();  // a notice's length
    } else {
      BundleReceive(*transports[0], 1, 3, "the output of stage 1 to stage 2", lengths).finish();
    }
  });
  EXPECT_NE(errors.find("rank 0: the output of stage 1 to stage 2: the message is not a pptrain "
                        "message"),
            std::string::npos)
      << errors;
}

}  // namespace
}  // namespace pptrain
