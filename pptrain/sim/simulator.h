// Discrete-event simulator: times a schedule under a CostModel and reports makespan, bubble
// ratio, per-rank busy/idle time and peak activation memory, plus a Timeline for rendering.
//
//   ValidatedSchedule s = validate(make_schedule({"1f1b", 4, 8}));
//   SimResult r = simulate(s, CostModel::parse("F=1,I=1,W=1"));
//   r.bubble_ratio;                  // 3/11
//   r.ranks[0].peak_activations;     // 4
//
// Rules: each rank runs its list strictly in order; an action starts when the rank is free and
// everything it waits for (inputs_of, pptrain/schedule/semantics.h) has happened, a message
// arriving `comm` after its SEND. OVERLAP_F_B waits for all its parts' inputs and lasts the sum
// of their times (a conservative choice: no overlap speed-up is assumed). SEND_* and RECV_* take
// no time on the rank; they appear in the timeline as zero-length events at the moment they
// happen.
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

#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/timeline.h"
#include "pptrain/schedule/validate.h"
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

// Simulates a validated schedule (validate.h): it always runs to completion.
SimResult simulate(const ValidatedSchedule& schedule, const CostModel& cost);

}  // namespace pptrain
