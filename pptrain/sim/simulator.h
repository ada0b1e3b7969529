// Discrete-event simulator: times a schedule under a CostModel and reports makespan, bubble
// ratio, per-rank busy/idle time and peak activation memory, plus a Timeline for rendering.
//
//   Schedule s = make_schedule({"1f1b", 4, 8});
//   SimResult r = simulate(s, CostModel::parse("F=1,I=1,W=1"));
//   r.bubble_ratio;                  // 3/11
//   r.ranks[0].peak_activations;     // 4
//
// Rules (each rank runs its list strictly in order; an action starts when the rank is free and
// its inputs have arrived):
//   F on stage s, microbatch m     after F(s-1, m) ended (+ comm if s-1 is on another rank)
//   I or B on s, m                 after F(s, m) and after I/B(s+1, m) (+ comm across ranks)
//   W on s, m                      after I(s, m)
//   OVERLAP_F_B                    waits for all its parts' inputs, lasts the sum of their times
//                                  (a conservative choice: no overlap speed-up is assumed)
//   SEND_* / RECV_*                take no time on the rank; a RECV waits for the arrival.
// A schedule without SEND/RECV is lowered first, so the timeline shows the comm actions too, as
// zero-length events at the moment they happen.
//
// Figures come from timeline_stats() (pptrain/sim/metrics.h), the same definitions used for
// measured runs: busy = sum of compute durations on a rank, idle = makespan - busy,
// bubble_ratio = 1 - sum(busy) / (P * cost), cost = longest rank span.
//
// Peak activations: the largest sum, over the (stage, microbatch) pairs whose F has ended and
// whose I or B has not, of the stage's activation memory (CostModel::activation; by default a
// chunk counts 1/V, so 1 = one microbatch of the rank's whole share). A stash is counted from the
// start of its F and released at the end of its I or B. The smaller stash that W still needs
// after I (inputs of weight layers, output gradients) is NOT counted by default;
// docs/SCHEDULE_FORMAT.md says the same. CostModel::stage_weight_stash, when given, counts it
// too, from the end of I to the end of W (in the same unit as the activations).
#pragma once

#include <string>
#include <vector>

#include "pptrain/render/timeline.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {

struct RankStats {
  int rank = 0;
  double busy = 0;              // sum of compute durations on this rank
  double idle = 0;              // makespan - busy
  double peak_activations = 0;  // in microbatches of this rank's whole share (see above)
};

struct SimResult {
  double makespan = 0;           // end of the last action over all ranks (the run starts at 0)
  double cost = 0;               // longest span (first start to last end) of any rank
  double bubble_ratio = 0;       // 1 - sum(busy) / (P * cost)
  std::vector<RankStats> ranks;  // [num_ranks]
  Timeline timeline;             // every action, comm actions as zero-length events
};

// Simulates the schedule (lowering it first if it has no SEND/RECV). Throws UserError if it
// cannot run to completion (a dependency cycle, or a RECV without its SEND), naming a stuck rank,
// the action it is stuck at and what that waits for; or if an action refers to a stage or
// microbatch outside the schedule or sits on a rank that does not run its stage.
SimResult simulate(const Schedule& schedule, const CostModel& cost);

}  // namespace pptrain
