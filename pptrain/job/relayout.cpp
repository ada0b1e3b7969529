#include "pptrain/job/relayout.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/partition/partition.h"
#include "pptrain/sim/simulator.h"
#include "pptrain/train/partition_plan.h"
#include "pptrain/train/plan_training.h"

namespace pptrain {
namespace {

std::string layout_text(const TrainOptions& options) {
  return "--pp " + std::to_string(options.pp) + " --dp " + std::to_string(options.dp);
}

std::string ms_text(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", ms);
  return text;
}

// `options` laid out as --pp `pp` --dp `dp`: the cut cleared, and after a restart --resume auto.
TrainOptions laid_out(const TrainOptions& options, int pp, int dp, bool restarted) {
  TrainOptions laid = options;
  laid.pp = pp;
  laid.dp = dp;
  laid.stage_layers.clear();
  if (restarted) laid.resume_dir = "auto";
  return laid;
}

}  // namespace

Relayout relayout_as(const TrainOptions& options, int pp, int dp, bool restarted) {
  Relayout laid{laid_out(options, pp, dp, restarted), std::nullopt, ""};
  laid.plan.emplace(plan_training(laid.options, /*may_profile=*/false));
  return laid;
}

Relayout relayout(const TrainOptions& options, int world, bool restarted,
                  std::optional<Profile>& layers) {
  PPTRAIN_ASSERT(world >= 1);
  struct Fit {
    TrainOptions options;
    std::optional<TrainingPlan> plan;
  };
  std::vector<Fit> fits;
  std::string refused;
  for (int dp = 1; dp <= world; ++dp) {
    if (world % dp != 0) continue;
    Fit fit{laid_out(options, world / dp, dp, restarted), std::nullopt};
    try {
      fit.plan.emplace(plan_training(fit.options, /*may_profile=*/true));
    } catch (const UserError& e) {
      refused = layout_text(fit.options) + ": " + e.what();
      continue;
    }
    fits.push_back(std::move(fit));
  }
  PPTRAIN_CHECK(!fits.empty(), "no layout of ", world, " ranks fits the run (", refused, ")");
  if (fits.size() == 1) return {fits.front().options, std::move(fits.front().plan), ""};
  if (!layers) {
    StageLayerOptions timing;
    timing.model = options.model;
    timing.microbatch_size = fits.front().plan->microbatch_size;
    layers = profile_layers(timing);
    layers->microbatch_size = static_cast<int>(timing.microbatch_size);
  }
  size_t best = 0;
  std::vector<double> step_ms;
  for (size_t i = 0; i < fits.size(); ++i) {
    // Timed on microbatches of layers->microbatch_size samples: one of b takes b / b0 as long.
    const TrainingPlan& plan = *fits[i].plan;
    const double scale =
        static_cast<double>(plan.microbatch_size) / std::max(layers->microbatch_size, 1);
    step_ms.push_back(predicted_step_ms(plan.schedule, plan.weights, *layers, plan.stage_layers,
                                        std::vector<double>(plan.stage_layers.size(), scale),
                                        plan.copies));
    if (step_ms[i] < step_ms[best]) best = i;
  }
  std::string choice = "predicted " + ms_text(step_ms[best]) + " a step";
  for (size_t i = 0; i < fits.size(); ++i) {
    if (i != best) choice += "; " + layout_text(fits[i].options) + ": " + ms_text(step_ms[i]);
  }
  return {fits[best].options, std::move(fits[best].plan), choice};
}

}  // namespace pptrain
