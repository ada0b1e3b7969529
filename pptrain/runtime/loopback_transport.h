// An in-process Transport: the ranks are threads of one process and pass tensors through shared
// mailboxes instead of sockets.
//
// A one-rank run (--pp 1) uses it, and so do tests that run a whole pipeline in one process, one
// std::thread per rank, without ports or a rendezvous:
//
//   auto transports = make_loopback_transports(/*world_size=*/2);
//   std::thread peer([&] { transports[1]->send(torch::ones({3}), /*peer=*/0, /*tag=*/7); });
//   auto buffer = torch::empty({3});
//   transports[0]->recv(buffer, /*peer=*/1, /*tag=*/7).wait();  // buffer now holds the ones
//   peer.join();
//
// What each operation does (matching c10d's point-to-point semantics where they overlap):
//   send     copies the tensor into the mailbox of (source, destination, tag) and is complete at
//            once: the caller may change the tensor as soon as send() returns.
//   recv     claims the next message of its (source, destination, tag): the n-th receive posted
//            gets the n-th message sent, so messages with one tag arrive in the order they were
//            sent. wait() blocks until that message is there and copies it into the buffer.
//   allreduce_sum, barrier
//            every rank calls them from its own thread; the last to arrive adds the parts in
//            rank order, so every rank gets the same bits.
// Every wait gives up after `timeout` with a std::runtime_error naming the waiting rank, the
// peer (or the ranks that never arrived at a collective) and the tag, instead of hanging.
// The transports share their mailboxes; each keeps them alive, so they may be destroyed in any
// order.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "pptrain/runtime/transport.h"

namespace pptrain {

// One Transport per rank 0 .. world_size-1 (element r has rank() == r), connected to each other.
// UserError unless world_size >= 1 and timeout > 0.
std::vector<std::unique_ptr<Transport>> make_loopback_transports(
    int world_size, std::chrono::milliseconds timeout = kDefaultCommTimeout);

}  // namespace pptrain
