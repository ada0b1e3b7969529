// A training run resolved once: plan_training() checks the flags (TrainOptions, plan.h) and
// makes the TrainingPlan every rank runs; `--plan FILE` sets the flags from `pptrain plan`'s
// choice first (apply_plan_file()).
//
//   TrainingPlan plan = plan_training(options, /*may_profile=*/true);   // every user error here
//
// plan_training() runs every check that does not need the workers (model, data file, schedule,
// partition, output paths, checkpoints to load or resume) in whichever process calls it, so bad
// input never starts a worker. Every rank of a run computes the same plan from the same flags:
// the parts that could differ between processes are resolved by the launching process and
// handed to its workers: `--partition time` (it measures this machine) as `--stage-layers`, and
// `--solver ilp` (its time limit could end differently) as `--solved-schedule`, a CSV file of
// the order.
#pragma once

#include "pptrain/planner/plan_file.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// `--plan FILE` (the plan.json of `pptrain plan`, planner/plan_file.h): which of the flags it
// sets the user gave as well, so that one contradicting it is an error, not silently replaced.
struct PlanFlagsGiven {
  bool pp = false, microbatches = false, batch_size = false, schedule = false,
       schedule_file = false, chunks = false, partition = false, stage_layers = false, dp = false,
       precision = false;
};

// Sets --pp, --dp, --microbatches, --batch-size, the schedule (the plan's CSV as
// --schedule-file), --chunks, the stage layers, --recompute, --precision, and the placement and
// --dp-shares the plan chose, from the plan. UserError (one line naming the flag, its value and the
// plan's) when a given flag contradicts the plan.
void apply_plan_file(const PlanFile& plan, const PlanFlagsGiven& given, TrainOptions& options);

// Checks the options and resolves the plan. UserError (one line) for anything a user can get
// wrong. With may_profile false, `--partition time` without a file is refused (a rank started
// by torchrun cannot measure the same timings as the others).
TrainingPlan plan_training(const TrainOptions& options, bool may_profile);

}  // namespace pptrain
