// Ranks as threads of this process, for the probes that time what ranks of one host do (the
// all-reduce, an action's overheads): each with its own Gloo transport over TCP on 127.0.0.1.
//
//   run_local_ranks(2, [](int rank, Transport& transport) { transport.barrier(); },
//                   "measuring the all-reduce");
#pragma once

#include <functional>
#include <string>

#include "pptrain/runtime/transport.h"

namespace pptrain {

// Runs body(rank, transport) for ranks 0..ranks-1 on threads, connected on a free port (no
// heartbeat: one process cannot lose a peer), and waits for all. UserError "<what> failed: ..."
// with the first error any rank threw.
void run_local_ranks(int ranks, const std::function<void(int rank, Transport& transport)>& body,
                     const std::string& what);

}  // namespace pptrain
