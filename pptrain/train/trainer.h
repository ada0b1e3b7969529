// The train loop: what `pptrain train` runs in every worker.
//
//   TrainingPlan plan = plan_training(options, /*may_profile=*/true);   // plan.h
//   auto transport = connect_transport(TransportOptions::from_env());
//   auto observers = make_observers(options);                            // observers.h
//   train(plan, *transport, raw_pointers(observers));
//
// train() builds this rank's stages from the plan, runs every step through one Executor, clips
// the global gradient norm and steps the optimizer after each flush, and hands rank 0's
// StepReport of each step to the observers (the other ranks' observers are not called). It
// saves the parameters one file per layer at the end when the plan says so.
#pragma once

#include <vector>

#include "pptrain/runtime/transport.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// Runs this process's rank of the plan (transport.world_size() must be plan.ranks()).
void train(const TrainingPlan& plan, Transport& transport,
           const std::vector<StepObserver*>& observers = {});

// The raw pointers of owned observers, for train().
std::vector<StepObserver*> raw_pointers(const std::vector<std::unique_ptr<StepObserver>>& owned);

}  // namespace pptrain
