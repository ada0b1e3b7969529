// The cut `pptrain train --partition workers` runs when ranks have their own memory limits: of
// the contiguous cuts of the model into the run's stages, the one whose slowest stage (its
// compute divided by the speed of the rank holding it) is fastest among those where every rank's
// peak, by the planner's memory model (planner.h: cut_peak_bytes), fits its own limit less the
// planner's margin.
//
//   WorkerCutRequest request;
//   request.profile = profile;              // every layer, for one microbatch of the run
//   request.planner.workers = P;            // and rank_memory_limits [P], the optimizer's factor
//   request.planner.rank_memory_limits = {0, 3e8};
//   request.shape.schedule = "1f1b";        // chunks, microbatches, recompute as the run's
//   request.stage_speeds = {1, 0.4};        // [stages]
//   request.time_cut = time_cut;            // the `time` cut for the speeds, tried first
//   WorkerCut cut = fit_cut_to_workers(request);   // UserError when no cut fits
//
// Which cuts are tried: the `time` cut first (kept if it fits, so a run whose ranks fit keeps the
// cut it had without limits); then, when the model has few enough cuts (at most kMaxWorkerCuts,
// C(L-1, S-1) for L layers and S stages: every cut of 10 layers into 4 stages, 84), all of them,
// ordered by their slowest stage, which makes the answer the fastest cut that fits; else the
// `uniform`, `params` and `time` cuts only (the planner's own).
#pragma once

#include <string>
#include <vector>

#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/planner/planner.h"

namespace pptrain {

constexpr long long kMaxWorkerCuts = 20000;

struct WorkerCutRequest {
  Profile profile;         // per layer, for one microbatch of the run (its microbatch_size)
  PlannerOptions planner;  // workers (P), rank_memory_limits ([P], 0: none), microbatches {M},
                           // batch_size, optimizer_state_factor, mem_w_ratio, memory_margin
  Candidate shape;         // schedule, chunks, microbatches, recompute of the run
  std::vector<double> stage_speeds;          // [stages] the speed of the rank holding each stage
  std::vector<LayerRange> time_cut;          // [stages] the `time` cut for those speeds
  bool gradient_buffers = false;             // the ranks all-reduce over data-parallel copies
  std::string what = "--partition workers";  // what messages start with; empty: nothing
};

struct WorkerCut {
  std::vector<LayerRange> stage_layers;  // [stages]
  std::vector<double> peak_bytes;        // [P] the memory model's peak of each rank
  double slowest_stage_ms = 0;           // the cut's slowest stage, over its rank's speed
  int cuts_tried = 0;                    // cuts whose peaks were predicted
};

// The slowest stage of `cut` in ms: its layers' F + I + W over its speed.
double slowest_stage_ms(const Profile& profile, const std::vector<LayerRange>& cut,
                        const std::vector<double>& stage_speeds);

// Every contiguous cut of `layers` layers into `stages` non-empty stages, in lexicographic order
// of their ends; empty when there are more than `most`.
std::vector<std::vector<LayerRange>> every_cut(int layers, int stages, long long most);

// The cut (see above). UserError, one line, when none fits: it names the rank and the smallest
// limit that works there with the other ranks' limits as they are, or, when no one rank's
// limit is enough to raise, each rank over its limit in the cut closest to fitting.
WorkerCut fit_cut_to_workers(const WorkerCutRequest& request);

}  // namespace pptrain
