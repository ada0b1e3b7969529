// The train loop of `pptrain train`: pptrain's own models (gpt, mlp) trained through the library
// (api/pipeline.h), as any program's model would be.
//
//   TrainingPlan plan = plan_training(options, /*may_profile=*/true);   // train/plan_training.h
//   auto transport = connect_transport(TransportOptions::from_env());
//   auto observers = make_observers(options);                            // train/observers.h
//   train(plan, *transport, raw_pointers(observers));
//
// train() checks that the ranks agree on the plan, builds this rank's stages of the model (from
// a checkpoint when the plan says so), makes one PipelineSchedule with the plan's schedule,
// copies and optimizer, feeds it the deterministic batches of the plan's data, and saves
// checkpoints (every --save-every steps and after the last). Rank 0's StepReports go to the
// observers (the other ranks' observers are not called).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/partition/straggler.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/plan_training.h"

namespace pptrain {

// --replan auto (job/worker_speeds.h): what train() watches after every step, and where the
// ranks leave the checkpoint a new cut starts from (one folder all of them reach).
struct CutWatch {
  StragglerWatch watch;
  std::string dir;
  int worker = 0;  // this process's rank among the processes, whichever rank it plays
};

// Where a run moved to a new cut: the steps done, the new cut and its speeds, the checkpoint.
struct MovedCut {
  int steps_done = 0;
  Replan replan;
  std::string dir;
};

// Runs this process's rank of the plan (transport.world_size() must be plan.world_size()). With
// `watch`, the ranks share their compute times after every step; when the watch gives a new cut,
// they save a checkpoint to watch->dir, rank 0 says so in one line, and train() returns where
// they stopped (the caller plans the rest for the new cut and resumes from it); when it says the
// cut stays, rank 0 says why in one line and the run goes on. Nothing when the run ended.
std::optional<MovedCut> train(const TrainingPlan& plan, Transport& transport,
                              const std::vector<StepObserver*>& observers = {},
                              CutWatch* watch = nullptr);

// The raw pointers of owned observers, for train().
std::vector<StepObserver*> raw_pointers(const std::vector<std::unique_ptr<StepObserver>>& owned);

}  // namespace pptrain
