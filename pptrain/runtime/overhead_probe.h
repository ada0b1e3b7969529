// Measures what the runtime spends on an action beyond the action's own work on this machine:
// the overheads of the cost model (sim/cost_model.h: action_overhead, send_overhead,
// recv_overhead), for `pptrain profile`, which saves them with the profile for the planner.
//
//   OverheadProfile o = measure_overheads();   // o.action_ms, o.send_ms, o.recv_ms
//
// Two ranks as threads of this process, each with its own Gloo process group over TCP on
// 127.0.0.1 (a free port), as `--pp 2` ranks on one host talk, run GPipe on 2 stages of empty
// actions (one layer y = x * w on [1, 1], M = 8) through the Executor, at the compute threads
// the caller set (`pptrain profile`: one); the overheads are read off their measured timelines as
// `--compare-sim` reads a run's (sim/compare.h: measure_costs, the gaps between events; per step
// the mean, then the median over the steps). A compute event there also holds some of the
// executor's work, which a profile's layer times do not: what the empty actions' events take
// beyond the same forward and backward run directly is added to action_ms. Takes about half a
// second; on a loaded machine the figures carry the load, as a training run there would.
#pragma once

#include "pptrain/partition/profile.h"

namespace pptrain {

struct OverheadProbeOptions {
  int steps = 20;  // measured steps, after 3 unmeasured ones
};

// UserError if the ranks cannot connect or the options are out of range.
OverheadProfile measure_overheads(const OverheadProbeOptions& options = {});

}  // namespace pptrain
