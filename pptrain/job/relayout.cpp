#include "pptrain/job/relayout.h"

#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/partition/partition.h"
#include "pptrain/sim/cost_model.h"
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

// The step `plan` is predicted to take, in ms (see the header), from `layers` timed on
// microbatches of `layers.microbatch_size` samples.
double predicted_step_ms(const TrainingPlan& plan, const Profile& layers) {
  CostModel cost = cost_from_profile(layers, plan.stage_layers, /*replicas=*/1);
  const double scale =
      static_cast<double>(plan.microbatch_size) / std::max(layers.microbatch_size, 1);
  for (auto* times : {&cost.stage_forward, &cost.stage_backward_input, &cost.stage_backward_weight,
                      &cost.stage_backward}) {
    for (double& t : *times) t *= scale;
  }
  if (plan.copies > 1) {
    cost.replicas = plan.copies;
    cost.reduce_bandwidth = kDefaultBandwidthBytesPerS / 1000;  // bytes per ms
    cost.stage_grad_bytes.clear();
    for (const LayerRange& range : plan.stage_layers) {
      double bytes = 0;
      for (int l = range.first; l <= range.second; ++l) bytes += layers.layers[l].parameter_bytes;
      cost.stage_grad_bytes.push_back(bytes);
    }
  }
  return simulate(plan.schedule, cost, plan.weights, Record::kFigures).makespan;
}

}  // namespace

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
    Fit fit{options, std::nullopt};
    fit.options.dp = dp;
    fit.options.pp = world / dp;
    fit.options.stage_layers.clear();
    if (restarted) fit.options.resume_dir = "auto";
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
    step_ms.push_back(predicted_step_ms(*fits[i].plan, *layers));
    if (step_ms[i] < step_ms[best]) best = i;
  }
  std::string choice = "predicted " + ms_text(step_ms[best]) + " a step";
  for (size_t i = 0; i < fits.size(); ++i) {
    if (i != best) choice += "; " + layout_text(fits[i].options) + ": " + ms_text(step_ms[i]);
  }
  return {fits[best].options, std::move(fits[best].plan), choice};
}

}  // namespace pptrain
