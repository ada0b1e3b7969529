// Measures how fast this host sums tensors over ranks: the all-reduce cost that data
// parallelism (--dp) adds to a step, for `pptrain profile` and the simulator's prediction.
//
//   NetworkProfile n = measure_allreduce(/*ranks=*/2);
//   // a ring all-reduce of N bytes: n.latency_ms + 2(r-1)/r x N / n.bandwidth_bytes_per_s
//
// The ranks are threads of this process, each with its own Gloo process group over TCP on
// 127.0.0.1 (a free port), as --dp copies on one host talk. Each size from 64 KiB to 16 MiB is
// summed several times; the median times are fitted by least squares to latency + k x bytes.
#pragma once

#include "pptrain/partition/profile.h"

namespace pptrain {

// UserError unless ranks >= 2. Takes about a second.
NetworkProfile measure_allreduce(int ranks = 2);

}  // namespace pptrain
