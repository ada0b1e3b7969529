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

#include <optional>
#include <string>
#include <vector>

#include "pptrain/partition/profile.h"
#include "pptrain/partition/straggler.h"
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

// --replan auto (collective over `processes`, the processes' own transport, not placed): trains
// `start` while a StragglerWatch (partition/straggler.h) watches the ranks' compute; when a rank
// changes speed it cuts for the speeds now measured as --partition workers cuts (cut_for_replan),
// and when that moves the run, plans the rest of it with the new cut and placement, resumes it
// from the checkpoint the ranks left in `dir` (on one file system for all) with each process
// playing its new rank (runtime/group.h: placed_view), and watches again, until the run ends.
// `uniform`: the run's plan before any cut (plan_training(options)). Without `start` (a plan
// not cut for the workers) the run starts from `uniform`, rank 0's layer profile (made here) and
// equal speeds. Each process's memory limit is read here, as --partition workers reads it.
void train_replanning(const TrainOptions& options, const TrainingPlan& uniform,
                      std::optional<WorkersCut> start, Transport& processes,
                      const std::vector<StepObserver*>& observers, const std::string& dir);

// What --replan auto cuts with (the Cutter of its watch): the cut and placement --partition
// workers would choose for `replan.speeds` ([rank], each the speed of the worker placement[r]
// plays; empty placement: the identity), within each worker's memory limit (`workers`,
// [worker]; their speeds are not read), over the placements it tries (the user's --placement
// only, when `uniform` has one). Fills replan.ranges, after_s, and placement when it differs
// from `placement`; or replan.kept, when no cut fits.
void cut_for_replan(const TrainOptions& options, const TrainingPlan& uniform,
                    const Profile& profile, const WorkersProfile& workers,
                    const std::vector<int>& placement, Replan& replan);

}  // namespace pptrain
