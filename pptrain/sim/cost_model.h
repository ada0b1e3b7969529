// How long each action takes and how much memory it holds (activations, and the weights when
// `weights` is set), for the simulator and the automatic schedules.
//
// Memory model (the zero-bubble paper's): the unit is one microbatch's forward activations on
// one stage (with V chunks per rank, a chunk's stash counts 1/V of the rank's share, so the unit
// stays "one microbatch of a rank's share"). F adds 1; I frees 1 - r and leaves r for W (the
// weight layers' inputs and output gradients), which W frees; a fused B frees all 1. r =
// M_W / M_B is `mem_w_ratio`, 0.5 by default (`--mem-w-ratio`). A limit of P units is the
// paper's ZB-1p (1F1B's memory), 2P its ZB-2p.
//
// The simple form gives the times of one rank's whole share of the model for one microbatch;
// with V chunks (stages) per rank each chunk takes 1/V of it (and holds 1/V of its memory).
// Per-stage vectors, when given, override that (e.g. from a profile and a partition). Units are
// arbitrary but shared: seconds when the figures come from a measured profile.
//
// Data parallelism (`--dp D`, schedule/reductions.h): a REDUCE_GRAD of stage s all-reduces its
// weight gradients over the D replicas of the stage. With stage_grad_bytes it takes the ring
// all-reduce's time, 2 (D-1)/D x stage_grad_bytes[s] / reduce_bandwidth + reduce_latency;
// without, the scalar `reduce` (one all-reduce of the rank's whole share at this D, 1/V of it
// per chunk). D = 1 (replicas) makes it free.
//
//   CostModel c = CostModel::parse("F=1,I=2,W=1,comm=0.1");
//   double t = c.time(Action::make(Op::B, 3, 0), /*num_stages=*/8, /*num_ranks=*/4);  // (2+1)/2
#pragma once

#include <string>
#include <vector>

#include "pptrain/generators/auto_schedule.h"
#include "pptrain/partition/partition.h"
#include "pptrain/schedule/action.h"

namespace pptrain {

struct CostModel {
  // Times of one rank's whole share for one microbatch. B (fused backward) = I + W.
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  // Latency of one transfer between ranks: delays the arrival, occupies neither rank.
  // Transfers between stages on the same rank are free.
  double comm = 0;
  // Latency of one skip connection's message (Schedule::skips), which may carry a larger tensor
  // than the cut's; 0: the same as comm. `skip=` in the text form.
  double skip_comm = 0;
  // What the runtime spends on an action beyond its own work, occupying the rank (unlike comm):
  // the executor's bookkeeping after each compute action (finding slots, posting the receives
  // ahead, recording the event), a SEND's packing and posting, and a RECV's taking of a message
  // that has arrived (unpacking, then the bookkeeping after it). 0: free, as before they were
  // counted. Measured per machine (runtime/overhead_probe.h, saved with the profile) or per run
  // (sim/compare.h). `action=`, `send=` and `recv=` in the text form.
  double action_overhead = 0;
  double send_overhead = 0;
  double recv_overhead = 0;
  // Optional per-stage times [num_stages]; when non-empty they override the scalars above.
  std::vector<double> stage_forward, stage_backward_input, stage_backward_weight;
  // Optional per-stage time of the fused backward B [num_stages]; empty: B = I + W. A measured
  // run gives it on its own (a fused B is not exactly the sum of a separate I and W).
  std::vector<double> stage_backward;
  // Optional activation memory per microbatch per stage [num_stages], any unit; empty = each
  // chunk holds 1/V of one microbatch's activations of the rank's whole share.
  std::vector<double> stage_activation;
  // Share r of a microbatch's activations that W still needs after I (M_W / M_B), in [0, 1]: I
  // frees 1 - r of them, W the remaining r.
  double mem_w_ratio = 0.5;
  // Optional memory per microbatch per stage [num_stages], same unit as stage_activation, that
  // the deferred weight gradients hold from the end of I to the end of W (the weight layers'
  // inputs and output gradients), e.g. measured; when non-empty it overrides mem_w_ratio.
  std::vector<double> stage_weight_stash;
  // Memory of ONE version of the rank's whole share of the weights, in the unit of the
  // activations (1 = one microbatch's activations of the whole share); 0 = weights not counted.
  // An asynchronous schedule holds several versions (schedule/weight_versions.h).
  double weights = 0;
  // Optional memory of one weight version per stage [num_stages], same unit; when non-empty it
  // overrides `weights` (whose chunk share is 1/V of it).
  std::vector<double> stage_weights;
  // Cores the schedule's ranks share (processes on one host; may be fractional, e.g. a copy's
  // share under --dp); 0: a core per rank. With fewer cores than computing ranks, each of the k
  // computing ranks runs at cores / k of its speed (processor sharing, simulator.h).
  double cores = 0;
  // Data-parallel replicas D of every stage, >= 1: a REDUCE_GRAD all-reduces over them.
  int replicas = 1;
  // Time of one all-reduce of the rank's whole share of the gradients over the D replicas (a
  // chunk's takes 1/V of it), when stage_grad_bytes is empty. `reduce=` in the text form.
  double reduce = 0;
  // Optional bytes of each stage's weight gradients [num_stages]; when non-empty a REDUCE_GRAD
  // takes the ring all-reduce's time from them, reduce_bandwidth and reduce_latency.
  std::vector<double> stage_grad_bytes;
  double reduce_bandwidth = 0;  // bytes per time unit of one replica's link (> 0 with bytes)
  double reduce_latency = 0;    // time units added to every all-reduce
  // Optional time of each stage's all-reduce [num_stages], e.g. measured (sim/compare.h); when
  // non-empty it overrides `reduce` and the ring formula, whatever `replicas` is.
  std::vector<double> stage_reduce;

  // Parses "F=1,I=1,W=1,comm=0,weights=4,reduce=2": any subset of the keys F, I, W, comm, skip,
  // weights, reduce, action, send, recv in any order, values finite and >= 0. F, I and W also
  // take one value per stage, "F=1:1:1:2" (stage_forward, ...: as many as the schedule's
  // stages). Throws UserError naming the bad piece.
  static CostModel parse(const std::string& text);
  // "F=1,I=1,W=1,comm=0", then ",skip=3", ",weights=4", ",reduce=2", ",action=0.1", ",send=0.1"
  // and ",recv=0.1" when non-zero (replicas and per-stage vectors are not printed).
  std::string to_string() const;
  // The latency of the message a SEND or RECV carries.
  double message_latency(const Action& comm_action) const {
    return is_skip_message(comm_action) && skip_comm > 0 ? skip_comm : comm;
  }
  // The time `action` occupies its rank beyond time(): action_overhead after a compute action
  // (OVERLAP_F_B is one), send_overhead for a SEND, recv_overhead for a RECV, 0 for a
  // REDUCE_GRAD (on its own channel). UserError for a negative or non-finite overhead.
  double overhead(const Action& action) const;
  // Whether any of the three overheads is non-zero.
  bool counts_overheads() const {
    return action_overhead != 0 || send_overhead != 0 || recv_overhead != 0;
  }
  // Whether the simulator's peak memory includes weights at all.
  bool counts_weights() const { return weights != 0 || !stage_weights.empty(); }

  // Duration of a compute action (F, I, W, B; OVERLAP_F_B = sum of its parts) or of a
  // REDUCE_GRAD (reduce_time) on a schedule of num_stages stages over num_ranks ranks. SEND/RECV
  // take 0. Throws UserError if a per-stage vector does not have num_stages entries.
  double time(const Action& action, int num_stages, int num_ranks) const;
  // Time of `stage`'s all-reduce over the replicas (see the top of the file): stage_reduce[stage]
  // if given, else 0 for D = 1.
  // UserError for replicas < 1, or stage_grad_bytes without a reduce_bandwidth > 0.
  double reduce_time(int stage, int num_stages, int num_ranks) const;
  // The same over `group` replicas instead of `replicas`: a replicated stage's all-reduce over its
  // own replicas (Schedule::replicas_of), 2 (r-1)/r x stage_grad_bytes[s] / reduce_bandwidth +
  // reduce_latency with r = group, or the scalar `reduce` (the time given for one all-reduce of
  // the rank's share, whatever r); 0 for a group of 1. stage_reduce still overrides it.
  double reduce_time(int stage, int num_stages, int num_ranks, int group) const;
  // Activation memory one microbatch holds on `stage` between its F and its I or B.
  double activation(int stage, int num_stages, int num_ranks) const;
  // Memory one microbatch holds on `stage` between its I and its W: stage_weight_stash if given,
  // else mem_w_ratio x activation().
  double weight_stash(int stage, int num_stages, int num_ranks) const;
  // Every stage's F, I, W times, activation, weight stash and comm, for an automatic schedule
  // (generators/auto_schedule.h), which counts no overheads: action_overhead is added to each
  // time, send_overhead + recv_overhead to comm. UserError as time() for vectors of the wrong
  // size.
  StageCosts stage_costs(int num_stages, int num_ranks) const;
  // Memory of one version of `stage`'s weights (0 unless weights or stage_weights). Named apart
  // from the field `weights`, which C++ does not let a method share.
  double weight_memory(int stage, int num_stages, int num_ranks) const;
};

// The cost model of the flags `--cost TEXT` and `--mem-w-ratio R` (pptrain schedule and train).
// UserError naming the flag for a bad piece of TEXT or an R outside [0, 1].
CostModel cost_model_from_flags(const std::string& cost, double mem_w_ratio);

// The cost model of a profiled model (`pptrain profile`) cut into `stages` (layer ranges of the
// profile, in stage order), in ms, for predicting a run: each stage's F, I, W summed over its
// layers; comm = the network latency + the largest cut's activation bytes / bandwidth; with
// `replicas` > 1 each stage's all-reduce takes the ring formula over its parameter bytes with
// the profile's measured bandwidth and latency; the action and message overheads are the
// profile's (Profile::overheads, 0 when it has none). UserError if a range is outside the profile,
// or `replicas` > 1 and the profile has no network measurement. mem_w_ratio is left at 0.5.
CostModel cost_from_profile(const Profile& profile, const std::vector<LayerRange>& stages,
                            int replicas);

}  // namespace pptrain
