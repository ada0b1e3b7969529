// Discrete-event simulator: times a schedule under a CostModel and reports makespan, bubble
// ratio, per-rank busy/idle time, peak activation memory, the weight versions each rank keeps
// and its peak memory (activations + weights), plus a Timeline for rendering.
//
//   ValidatedSchedule s = validate(make_schedule({"1f1b", 4, 8}));
//   SimResult r = simulate(s, CostModel::parse("F=1,I=1,W=1"));
//   r.bubble_ratio;                  // 3/11
//   r.ranks[0].peak_activations;     // 4
//
//   // pipedream (no flush): pass its weight rule (registry.h: version_rule_of)
//   ValidatedSchedule a = validate(make_schedule({"pipedream", 4, 3 * 8}));
//   SimResult q = simulate(a, CostModel::parse("weights=2"),
//                          version_rule_of("pipedream", /*stages=*/4, /*microbatches=*/8));
//   q.ranks[0].weight_versions;      // 4
//   q.ranks[0].peak_memory;          // peak_activations + 4 * 2
//
// Rules: each rank runs its list strictly in order; an action starts when the rank is free and
// everything it waits for (inputs_of, pptrain/schedule/semantics.h) has happened, a message
// arriving `comm` after its SEND. OVERLAP_F_B waits for all its parts' inputs and lasts the sum
// of their times (a conservative choice: no overlap speed-up is assumed). SEND_* and RECV_* take
// no time on the rank (without overheads, below); they appear in the timeline as zero-length
// events at the moment they happen. A REDUCE_GRAD (data parallelism, schedule/reductions.h) starts
// when the rank reaches it in its list (its previous action ended) and runs for
// CostModel::reduce_time on a channel of its own, one reduction after another: the rank's following
// actions do not wait for it. It is an event of its rank, so the rank's end, its span and the
// makespan include it. In a replicated schedule (Schedule::placement) a REDUCE_GRAD sums a stage's
// gradients over its replicas: each replica starts it when it reaches it and its channel is free,
// and it ends on all of them at the latest of those starts plus CostModel::reduce_time over the
// stage's replica count. There every stage is one rank's whole share for the cost model (V = 1).
//
// Overheads (CostModel::action_overhead, send_overhead, recv_overhead; 0 by default): after
// each compute action its rank stays occupied for action_overhead (the executor's bookkeeping:
// the next action starts that much later; the compute event, and so busy, stays the compute); a
// SEND occupies its rank for send_overhead and its message leaves at the SEND's end; a RECV
// starts when the rank is free and the message has arrived, and occupies the rank for
// recv_overhead. Those SEND and RECV events then have that length (not busy: not compute).
//
// Shared cores (CostModel::cores > 0, e.g. 4 worker processes on a 2-core host): the run follows
// one clock from event to event, and while k ranks compute they each progress at
// min(1, cores / k) of their speed (processor sharing, as the operating system shares the cores
// out). A REDUCE_GRAD on its rank's channel counts as one more task while it runs (on one host
// the all-reduce's copies and sums take a core); a replicated schedule's reductions do not, nor
// do the overheads (they pass at full speed: a simplification). With a core per task that gives
// the times above.
//
// Figures come from timeline_stats() (pptrain/sim/metrics.h; a TimelineTally of the events as
// they happen, so that Record::kFigures needs no timeline), the same definitions used for
// measured runs: busy = sum of compute durations on a rank, idle = makespan - busy,
// bubble_ratio = 1 - sum(busy) / (P * cost), cost = longest rank span. A reduction is not
// compute: under compute it adds nothing, and the part of it after the rank's last compute
// (the exposed all-reduce) is idle time and bubble.
//
// Peak activations, in the memory model of cost_model.h (unit: one microbatch's forward
// activations on one stage; a chunk counts 1/V of a rank's share): a microbatch's stash on a
// stage is counted from the start of its F; its I releases all but the share r
// (CostModel::mem_w_ratio, default 0.5, or CostModel::stage_weight_stash) that its W still
// needs, and W releases that at its end; a fused B releases all of it at its end. With r = 0.5
// and enough microbatches 1F1B peaks at P - k on rank k, ZB-H1 at P - k/2 and ZB-H2 at
// 2P - 1 - k, so P (ZB-1p) and 2P (ZB-2p) bound them (simulator_test.cpp); `--memory-limit K`
// caps this figure (check_peak_within_limit).
//
// Weight versions: stage s keeps rule.versions_kept(s) versions of its weights
// (pptrain/schedule/weight_versions.h: 1 for a synchronous schedule, more for an asynchronous
// one), and a rank's weight_versions is the most any of its stages keeps. Peak memory:
//
//   peak_memory = peak_activations + sum over the rank's stages s of
//                 versions_kept(s) * CostModel::weight_memory(s)
//
// (by default a chunk's version counts 1/V of CostModel::weights; a cost model that does not
// count weights gives peak_memory == peak_activations). The versions are counted as held for
// the whole run, so they add a constant to every moment. That is exact in the steady state of
// an asynchronous pipeline, where every stage holds all its versions at once (versions_kept is
// that count) and, in the 1F1B order of the asynchronous schedules, the activations peak too;
// the warm-up and cool-down hold fewer versions, which the figure does not credit.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/timeline.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {

struct RankStats {
  int rank = 0;
  double busy = 0;              // sum of compute durations on this rank (not the reductions)
  double idle = 0;              // makespan - busy
  double peak_activations = 0;  // memory-model units (see above)
  int weight_versions = 1;      // the most versions one of this rank's stages keeps
  double peak_memory = 0;       // peak_activations + the weight versions (see above), same unit
};

struct SimResult {
  double makespan = 0;           // end of the last action (reductions included) over all ranks
                                 // (the run starts at 0)
  double cost = 0;               // longest span (first start to last end) of any rank
  double bubble_ratio = 0;       // 1 - sum(busy) / (P * cost)
  std::vector<RankStats> ranks;  // [num_ranks]
  Timeline timeline;             // every action, comm actions as zero-length events (with
                                 // Record::kTimeline; else no events)
};

// What a simulation keeps: its timeline (to draw or compare it) or only the figures (a summary,
// a planner's candidates: the same figures without an event per action in memory). For the
// figures of a schedule that validate() was given compute-only (no skip messages, no replicas, a
// core per rank), the run takes it as given, never lowered: there a message only delays its
// consumer to its producer's end plus the latency, which the consumer then waits for itself.
enum class Record { kTimeline, kFigures };

// Simulates a validated schedule (validate.h): it always runs to completion. `rule` says how
// many weight versions each stage keeps; the default is synchronous (one version). Throws
// UserError if an asynchronous rule is for another number of stages than the schedule's.
SimResult simulate(const ValidatedSchedule& schedule, const CostModel& cost,
                   const VersionRule& rule = VersionRule{}, Record record = Record::kTimeline);

// The step a run is predicted to take from a layer profile, in the profile's unit (ms), as
// `pptrain train` predicts its own runs (job/relayout.h, job/worker_speeds.h): `profile`'s layers
// cut into `stages` (cost_from_profile: transfers free without a network measurement), each
// stage's F, I and W times multiplied by `stage_scale[s]` (a microbatch of another size than the
// profile's, a rank slower than the one that timed them; empty: 1); with `copies` > 1 each
// stage's all-reduce over them takes the ring's time over its parameter bytes at the profile's
// bandwidth, or PipeDream's 1 GB/s without one.
double predicted_step_ms(const ValidatedSchedule& schedule, const VersionRule& rule,
                         const Profile& profile, const std::vector<LayerRange>& stages,
                         const std::vector<double>& stage_scale, int copies = 1);

// `--memory-limit`: UserError (one line naming the schedule, the rank, its peak and the limit)
// when a rank's peak_activations is above `limit`; 0 means no limit.
void check_peak_within_limit(const SimResult& result, double limit, const std::string& schedule);

}  // namespace pptrain
