// The layout of an elastic run whose nodes met again with another number of ranks than
// --pp x --dp (a node lost, or one more: job/supervisor.h). Every (P, D) with P x D = the ranks
// they hold that the run's options allow is planned as `pptrain train` would plan it, and the
// simulator predicts its step from the model's layers timed on this machine: the fastest wins.
//
//   std::optional<Profile> layers;                           // timed once, kept for the next
//   Relayout next = relayout(options, /*world=*/2, /*restarted=*/true, layers);
//   next.options, *next.plan                                 // next.choice says why
//
// What a step is predicted to cost (sim/simulator.h: predicted_step_ms): each stage's F, I and W
// summed over its layers, timed at the run's first layout's microbatch size and scaled linearly
// to each candidate's (a microbatch of b samples takes b / b0 as long); transfers free; with D
// copies each stage's all-reduce takes the ring's time over its parameter bytes at 1 GB/s
// (PipeDream's figure, as `pptrain plan` takes without a network measurement). Memory is not
// weighed: the run's --memory-limit, where given, refuses a layout as it would at the start.
#pragma once

#include <optional>
#include <string>

#include "pptrain/partition/profile.h"
#include "pptrain/train/plan.h"

namespace pptrain {

struct Relayout {
  TrainOptions options;  // `options` with --pp and --dp chosen, the cut cleared, and after a
                         // restart --resume auto
  std::optional<TrainingPlan> plan;  // its plan (plan_training())
  // "predicted 41.2 ms a step; --pp 1 --dp 2: 45.5 ms"; empty when only one layout applied.
  std::string choice;
};

// The layout for `world` ranks (see above). `layers`: the model's timed layers, filled at the
// first call that needs them (a single candidate needs none). UserError when no (P, D) applies,
// naming the last reason.
Relayout relayout(const TrainOptions& options, int world, bool restarted,
                  std::optional<Profile>& layers);

// The layout --pp `pp` --dp `dp` of `options`, as relayout() makes each candidate, without
// timing anything: for the ranks that take another rank's choice. UserError when it does not fit.
Relayout relayout_as(const TrainOptions& options, int pp, int dp, bool restarted);

}  // namespace pptrain
