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
//      data-parallel copy), and the `time` partitioner cuts for those speeds;
//   5. when some rank has a memory limit (its cgroup's, or --worker-memory-limits), the cut is
//      the fastest whose every rank's peak, by the planner's memory model, fits its own limit
//      (planner/worker_cut.h); none: a one-line UserError naming the rank and the smallest
//      limit that works there, on every rank, before any stage is built.
// Every rank then plans the run with the ranges as --stage-layers; rank 0 prints one line per
// rank and the cut.
//
//   WorkersCut cut = plan_for_workers(options, uniform, transport);   // collective
//   train(cut.plan, transport, observers);                           // job/trainer.h
#pragma once

#include <string>
#include <vector>

#include "pptrain/partition/profile.h"
#include "pptrain/partition/workers.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/plan_training.h"

namespace pptrain {

// Step 1-2: every rank's speed and memory limit (collective): `memory_limit_bytes` where > 0
// (--worker-memory-limits), else its cgroup's.
WorkersProfile measure_workers(Transport& transport, double memory_limit_bytes = 0);

// The speed of each of `plan`'s stages: the slowest of the ranks (all copies) that hold it.
std::vector<double> stage_speeds(const TrainingPlan& plan, const std::vector<double>& rank_speeds);

// A plan with what it was cut by: rank 0's layer profile and each rank's relative speed.
struct WorkersCut {
  TrainingPlan plan;
  Profile profile;
  std::vector<double> speeds;  // [rank]
};

// Steps 1-4, then plan_training() with the cut (collective; `options.partition` is "workers").
// `uniform` is the plan before the cut (plan_training(options), which holds the uniform cut): its
// schedule says which rank holds which stage.
WorkersCut plan_for_workers(const TrainOptions& options, const TrainingPlan& uniform,
                            Transport& transport);

// --replan auto (collective): trains `start` while a StragglerWatch (partition/straggler.h)
// watches the ranks' compute; when it moves the run to a new cut, plans the rest of the run with
// that cut, resumes it from the checkpoint the ranks left in `dir` (on one file system for all),
// and watches again, until the run ends. A plan not cut for the workers starts from rank 0's
// layer profile (made here) and equal speeds.
void train_replanning(const TrainOptions& options, const TrainingPlan& start, Transport& transport,
                      const std::vector<StepObserver*>& observers, const std::string& dir);
void train_replanning(const TrainOptions& options, WorkersCut start, Transport& transport,
                      const std::vector<StepObserver*>& observers, const std::string& dir);

}  // namespace pptrain
