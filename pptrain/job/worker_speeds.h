// `pptrain train --partition workers`: the ranks measure themselves and cut the model for the
// workers they are, after they have met and before any stage is built.
//
//   1. every rank runs matrix products for a fixed wall-clock window at the same time
//      (device/worker_probe.h), and reads its cgroup's memory limit;
//   2. the figures go to every rank (one all-reduce), as a WorkersProfile (partition/workers.h):
//      speeds relative to the fastest rank;
//   3. rank 0 times every layer (models/profiler.h) while the others wait, and sends the times
//      to all, so every rank cuts with the same numbers;
//   4. each stage's speed is that of the slowest rank holding it (its pipeline rank in every
//      data-parallel copy), and the `time` partitioner cuts for those speeds.
// Every rank then plans the run with the ranges as --stage-layers; rank 0 prints one line per
// rank and the cut.
//
//   TrainingPlan plan = plan_for_workers(options, uniform, transport);   // collective
#pragma once

#include "pptrain/partition/workers.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// Step 1-2: every rank's speed and memory limit (collective).
WorkersProfile measure_workers(Transport& transport);

// The speed of each of `plan`'s stages: the slowest of the ranks (all copies) that hold it.
std::vector<double> stage_speeds(const TrainingPlan& plan, const std::vector<double>& rank_speeds);

// Steps 1-4, then plan_training() with the cut (collective; `options.partition` is "workers").
// `uniform` is the plan before the cut (plan_training(options), which holds the uniform cut): its
// schedule says which rank holds which stage.
TrainingPlan plan_for_workers(const TrainOptions& options, const TrainingPlan& uniform,
                              Transport& transport);

}  // namespace pptrain
