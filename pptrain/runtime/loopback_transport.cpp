#include "pptrain/runtime/loopback_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// "120 s", or "250 ms" for the short timeouts of tests, so that the message never reads "0 s".
std::string format_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() % 1000 == 0) return std::to_string(timeout.count() / 1000) + " s";
  return std::to_string(timeout.count()) + " ms";
}

// What the ranks of one loopback world share. One mutex guards everything: the messages are few
// and small next to the compute between them, so contention does not matter, and one lock makes
// the ordering rules easy to see.
class Hub {
 public:
  Hub(int world_size, std::chrono::milliseconds timeout)
      : world_size_(world_size), timeout_(timeout), round_(std::make_shared<Round>(world_size)) {}

  int world_size() const { return world_size_; }

  void post_message(int source, int destination, int tag, torch::Tensor copy) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Mailbox& box = mailboxes_[{source, destination, tag}];
      box.messages.emplace(box.sends++, std::move(copy));
    }
    changed_.notify_all();
  }

  // The number of the message a receive posted now will take.
  uint64_t claim_message(int source, int destination, int tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    return mailboxes_[{source, destination, tag}].receives++;
  }

  // Waits for message `ticket` of (source, destination, tag) and copies it into `buffer`.
  void take_message(int source, int destination, int tag, uint64_t ticket,
                    const torch::Tensor& buffer) {
    std::unique_lock<std::mutex> lock(mutex_);
    Mailbox& box = mailboxes_[{source, destination, tag}];  // std::map: the reference stays valid
    const bool arrived =
        changed_.wait_for(lock, timeout_, [&] { return box.messages.count(ticket) > 0; });
    if (!arrived) {
      throw std::runtime_error("rank " + std::to_string(destination) + ": receive from rank " +
                               std::to_string(source) + " with tag " + std::to_string(tag) +
                               " timed out after " + format_timeout(timeout_) +
                               " (no matching send arrived)");
    }
    auto node = box.messages.extract(ticket);
    lock.unlock();
    const torch::Tensor& message = node.mapped();
    if (message.sizes() != buffer.sizes() || message.dtype() != buffer.dtype()) {
      throw std::runtime_error("rank " + std::to_string(destination) + ": the message from rank " +
                               std::to_string(source) + " with tag " + std::to_string(tag) +
                               " is " + std::string(message.dtype().name()) + " " +
                               c10::str(message.sizes()) + " but the receive buffer is " +
                               std::string(buffer.dtype().name()) + " " + c10::str(buffer.sizes()));
    }
    torch::NoGradGuard no_grad;  // the buffer may be a leaf that requires grad
    buffer.copy_(message);
  }

  // The hub of the group of `members` (its ranks are their positions): made by the first member
  // to ask, shared with the others.
  std::shared_ptr<Hub> subgroup(const std::vector<int>& members) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Hub>& hub = subgroups_[members];
    if (!hub) hub = std::make_shared<Hub>(static_cast<int>(members.size()), timeout_);
    return hub;
  }

  // The hub of an independent transport among the same ranks, named `name`: made by the first
  // rank to ask, shared with the others.
  std::shared_ptr<Hub> independent(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Hub>& hub = independent_[name];
    if (!hub) hub = std::make_shared<Hub>(world_size_, timeout_);
    return hub;
  }

  // One collective of `rank`: adds `part` (undefined for a barrier) to the current round and
  // waits until every rank has; returns the sum over the ranks (undefined for a barrier).
  torch::Tensor gather(int rank, const torch::Tensor& part, const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    // A rank enters a round only after its previous one completed, so `round` is never one this
    // rank has already joined.
    const std::shared_ptr<Round> round = round_;
    PPTRAIN_ASSERT(!round->arrived[rank], "rank ", rank, " joined a collective twice");
    round->arrived[rank] = true;
    round->parts[rank] = part.defined() ? part.detach().clone() : part;
    if (++round->count == world_size_) {
      if (part.defined()) {
        round->sum = round->parts[0].clone();
        for (int r = 1; r < world_size_; ++r) {
          PPTRAIN_ASSERT(round->parts[r].sizes() == round->sum.sizes(), what, " of rank ", r,
                         " has shape ", round->parts[r].sizes(), ", rank 0's ", round->sum.sizes());
          round->sum.add_(round->parts[r]);
        }
      }
      round->parts.clear();
      round->done = true;
      // The next collective starts a fresh round; waiters keep their own through `round`.
      round_ = std::make_shared<Round>(world_size_);
      changed_.notify_all();
    } else if (!changed_.wait_for(lock, timeout_, [&] { return round->done; })) {
      std::string missing;
      for (int r = 0; r < world_size_; ++r) {
        if (!round->arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + what + " timed out after " +
                               format_timeout(timeout_) + " waiting for rank(s) " + missing);
    }
    return round->sum;
  }

 private:
  // The messages from one rank to another with one tag. Sends and receives are each numbered in
  // the order they were made; receive n takes message n.
  struct Mailbox {
    std::map<uint64_t, torch::Tensor> messages;  // send number -> copy of the sent tensor
    uint64_t sends = 0;                          // sends so far
    uint64_t receives = 0;                       // receives posted so far
  };

  // One all-reduce or barrier, from the first rank's arrival until the last one's.
  struct Round {
    explicit Round(int world_size) : parts(world_size), arrived(world_size, false) {}
    std::vector<torch::Tensor> parts;  // each rank's contribution, until the sum is taken
    std::vector<bool> arrived;
    int count = 0;  // ranks arrived
    bool done = false;
    torch::Tensor sum;
  };

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;  // a message arrived or a round completed
  std::map<std::tuple<int, int, int>, Mailbox> mailboxes_;      // (source, destination, tag)
  std::shared_ptr<Round> round_;                                // the collective being gathered
  std::map<std::vector<int>, std::shared_ptr<Hub>> subgroups_;  // members -> their hub
  std::map<std::string, std::shared_ptr<Hub>> independent_;     // name -> its hub
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }

  PendingComm send(const torch::Tensor& tensor, int peer, int tag) override {
    check_peer(peer, "send to");
    PPTRAIN_ASSERT(tensor.is_contiguous(), "send needs a contiguous tensor");
    // A copy, so the send is complete now and the caller may reuse its tensor.
    hub_->post_message(rank_, peer, tag, tensor.detach().clone());
    return PendingComm({}, tensor);
  }

  PendingComm recv(const torch::Tensor& buffer, int peer, int tag) override {
    check_peer(peer, "receive from");
    PPTRAIN_ASSERT(buffer.is_contiguous(), "recv needs a contiguous buffer");
    // Claimed when posted, not when waited on: receives with one tag may be waited on in any
    // order and still get the messages in the order they were posted.
    const uint64_t ticket = hub_->claim_message(peer, rank_, tag);
    return PendingComm([hub = hub_, peer, rank = rank_, tag, ticket,
                        buffer] { hub->take_message(peer, rank, tag, ticket, buffer); },
                       buffer);
  }

  // Joins the collective at wait(): a rank's collectives on one hub still come in the order it
  // started them, and a rank that has not waited yet only delays the others, as a slow peer would.
  PendingComm allreduce_sum_async(const torch::Tensor& tensor) override {
    PPTRAIN_ASSERT(tensor.is_contiguous(), "all-reduce needs a contiguous tensor");
    return PendingComm(
        [hub = hub_, rank = rank_, tensor] {
          const torch::Tensor sum = hub->gather(rank, tensor, "all-reduce");
          torch::NoGradGuard no_grad;
          tensor.copy_(sum);
        },
        tensor);
  }

  void barrier() override { hub_->gather(rank_, torch::Tensor(), "barrier"); }

  std::unique_ptr<Transport> subgroup(const std::vector<int>& members) override {
    const auto position = std::find(members.begin(), members.end(), rank_);
    PPTRAIN_ASSERT(position != members.end(), "rank ", rank_, " is not in its group");
    return std::make_unique<LoopbackTransport>(hub_->subgroup(members),
                                               static_cast<int>(position - members.begin()));
  }

  std::unique_ptr<Transport> independent(const std::string& name) override {
    return std::make_unique<LoopbackTransport>(hub_->independent(name), rank_);
  }

  LinkKind link_to(int /*peer*/) const override { return LinkKind::kLocal; }

 private:
  void check_peer(int peer, const char* what) const {
    PPTRAIN_ASSERT(peer >= 0 && peer < hub_->world_size(), "rank ", rank_, " cannot ", what,
                   " rank ", peer, " in a world of ", hub_->world_size());
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_loopback_transports(
    int world_size, std::chrono::milliseconds timeout) {
  PPTRAIN_CHECK(world_size >= 1, "a loopback world needs at least one rank, got ", world_size);
  PPTRAIN_CHECK(timeout.count() > 0, "the loopback timeout must be positive, got ", timeout.count(),
                " ms");
  auto hub = std::make_shared<Hub>(world_size, timeout);
  std::vector<std::unique_ptr<Transport>> transports;
  for (int rank = 0; rank < world_size; ++rank) {
    transports.push_back(std::make_unique<LoopbackTransport>(hub, rank));
  }
  return transports;
}

}  // namespace pptrain
