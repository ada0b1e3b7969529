// Point-to-point and collective communication between pipeline ranks.
//
// A Transport is the runtime's only view of the other ranks: non-blocking send/recv of one
// tensor, a blocking sum all-reduce and a barrier. Two implementations:
//   connect_transport(options)    a c10d ProcessGroup (Gloo on CPU; NCCL when LibTorch was built
//                                 with it and options.backend == "nccl"), rendezvous through a
//                                 c10d TCPStore served by rank 0, as torchrun sets it up. With
//                                 TransportOptions::shared_memory, its sends and receives between
//                                 ranks of one host go through rings in shared memory that the
//                                 waiting thread polls, then sleeps on (no Gloo thread between).
//   make_loopback_transports(P)   P ranks as threads of one process (loopback_transport.h); with
//                                 P = 1 it is the transport of a one-process run (--pp 1).
//
//   auto transport = connect_transport(TransportOptions::from_env());
//   auto sent = transport->send(activation, /*peer=*/1, message_tag(...));
//   auto got = transport->recv(buffer, /*peer=*/0, message_tag(...));  // posted early
//   got.wait();   // buffer now holds the data
//   sent.wait();  // at the latest before `activation` is modified or the step ends
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/runtime/links.h"
#include "pptrain/schedule/action.h"
#include "pptrain/schedule/schedule.h"

namespace pptrain {

// A send or receive in flight, from any Transport. It holds the tensor, so that the tensor
// outlives the operation, and a waiter: a function that blocks until the operation is done and
// throws (naming the timeout) when it fails or takes longer than its transport's timeout. Each
// implementation supplies its own waiter, so this class knows nothing of c10d. Move-only: one
// operation is waited on by one owner.
class PendingComm {
 public:
  using Waiter = std::function<void()>;

  PendingComm() = default;
  // An empty `waiter` makes an operation that is already complete.
  PendingComm(Waiter waiter, torch::Tensor tensor)
      : waiter_(std::move(waiter)), tensor_(std::move(tensor)) {}
  // A moved-from PendingComm is complete: its waiter is taken, not copied (std::function leaves
  // a moved-from function unspecified).
  PendingComm(PendingComm&& other) noexcept
      : waiter_(std::exchange(other.waiter_, nullptr)), tensor_(std::move(other.tensor_)) {}
  PendingComm& operator=(PendingComm&& other) noexcept {
    waiter_ = std::exchange(other.waiter_, nullptr);
    tensor_ = std::move(other.tensor_);
    return *this;
  }
  PendingComm(const PendingComm&) = delete;
  PendingComm& operator=(const PendingComm&) = delete;

  // Blocks until the operation is done; throws if it fails or times out, and then a later call
  // waits again. After a successful wait, later calls return at once.
  void wait() {
    if (!waiter_) return;
    waiter_();
    waiter_ = nullptr;
  }
  bool pending() const { return static_cast<bool>(waiter_); }
  const torch::Tensor& tensor() const { return tensor_; }

 private:
  Waiter waiter_;
  torch::Tensor tensor_;
};

// How long a rendezvous, receive or collective may take before it is an error, unless set.
inline constexpr std::chrono::milliseconds kDefaultCommTimeout = std::chrono::seconds(60);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Non-blocking. `tensor` must be contiguous and stay unmodified until the result is waited on.
  virtual PendingComm send(const torch::Tensor& tensor, int peer, int tag) = 0;
  // Non-blocking. Fills the preallocated, contiguous `buffer`; read it only after wait().
  virtual PendingComm recv(const torch::Tensor& buffer, int peer, int tag) = 0;
  // Starts an in-place sum of `tensor` (contiguous) over all ranks; read or change it only after
  // wait(). Every rank starts the same collectives in the same order; they may run while the
  // caller computes (c10d runs them on its own threads; the loopback sums at wait()).
  virtual PendingComm allreduce_sum_async(const torch::Tensor& tensor) = 0;
  // Blocking in-place sum over all ranks.
  void allreduce_sum(torch::Tensor& tensor) { allreduce_sum_async(tensor).wait(); }
  virtual void barrier() = 0;
  // A transport among some of the ranks: `members` (ranks of this transport, ascending, with
  // this rank among them, at least two, fewer than all). Its ranks are the positions in
  // `members`; its sends, receives and collectives reach only them. Every member calls it with
  // the same list, at the same point of its run; the other ranks do not call it. Use
  // make_group() (group.h), which also covers one rank and all ranks.
  virtual std::unique_ptr<Transport> subgroup(const std::vector<int>& members) = 0;
  // A transport among the same ranks whose operations never order with this one's: for a
  // thread of its own (a checkpoint written in the background) that must not interleave its
  // collectives with the pipeline's. Every rank calls it with the same `name`, at the same
  // point of its run.
  virtual std::unique_ptr<Transport> independent(const std::string& name) = 0;
  // What carries this rank's sends to and receives from `peer` (runtime/links.h): kShm when the
  // pair's rings mapped (messages up to 4 MiB; larger ones go through Gloo), kGloo, kNccl; kLocal
  // for ranks that are threads of one process, and for this rank itself.
  virtual LinkKind link_to(int peer) const = 0;
};

struct TransportOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string backend = "gloo";  // "gloo" or "nccl" (only when built with NCCL)
  // Every rendezvous, receive and collective fails after this long instead of hanging.
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  // Once every rank has joined, a thread publishes a counter in the store every second and
  // watches the other ranks'. A rank whose counter stays still for `timeout` (stopped, or its
  // whole process hung) stops this process with one line, "pptrain: error: rank 0: rank 1 has
  // not answered for 60 s (stopped or hung)", even when nothing here waits on it. A rank says it
  // is done when its transport is destroyed, so one that finished is never taken for a hang.
  bool heartbeat = true;
  // Point-to-point messages of up to 4 MiB (less 64 bytes) between ranks of this host through
  // shared memory, polled by the waiting thread, instead of Gloo's TCP (collectives stay on Gloo).
  // A pair of ranks uses it when both ask for it, both could map its rings and /dev/shm has room
  // for every ring of this host's ranks; else Gloo. from_env(): on unless PPTRAIN_SHM=0 (or off).
  bool shared_memory = false;

  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them. UserError if missing or
  // malformed; `timeout` from PPTRAIN_COMM_TIMEOUT_S when set.
  static TransportOptions from_env();
};

std::unique_ptr<Transport> connect_transport(const TransportOptions& options);

// Tags of the pipeline's point-to-point messages. A SEND and the RECV at its other end carry the
// same Message (schedule/semantics.h, the one definition of a message), and a message's tag is its
// message_index(): both ends agree on it, and no two messages of a step share one. A step's
// messages are all waited on before the next step, so reusing the tags step after step is safe.
// Control messages use tags from kControlTagBase up; UserError when the schedule has too many
// messages (skip messages included) for their tags to stay below it.
int message_tag(const Action& comm, const Schedule& schedule);
constexpr int kControlTagBase = 1 << 30;

}  // namespace pptrain
