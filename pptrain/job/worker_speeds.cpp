#include "pptrain/job/worker_speeds.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/worker_probe.h"
#include "pptrain/job/trainer.h"
#include "pptrain/partition/partition.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"
#include "pptrain/train/partition_plan.h"

namespace pptrain {
namespace {

// Long enough for a rank held to a share of a core to show it: eight periods of the CPU
// controller (100 ms by default).
constexpr std::chrono::milliseconds kProbeWindow{800};

// Sums `values` over the ranks (fp64, so that speeds and times arrive as they were sent).
torch::Tensor summed(torch::Tensor values, Transport& transport) {
  transport.allreduce_sum_async(values).wait();
  return values;
}

// A short window for rank 0's rate computing alone.
constexpr std::chrono::milliseconds kAloneWindow{300};

// Rank 0's layer times, the same on every rank: rank 0 measures them while the others wait,
// and, when `alone_rate` is given, its rate of matrix products computing alone, the rate its
// layer times were measured at (for the predicted step time).
Profile shared_layer_profile(const StageLayerOptions& options, Transport& transport,
                             double* alone_rate) {
  Profile profile;
  const int L = num_layers(options.model);
  auto times = torch::zeros({L + 1, 3}, torch::kFloat64);  // [layer] = {F, I, W} ms; [L][0] rate
  if (transport.rank() == 0) {
    if (alone_rate != nullptr) times[L][0] = matrix_product_rate(kAloneWindow);
    profile = profile_layers(options);
    for (int l = 0; l < L; ++l) {
      const LayerProfile& layer = profile.layers[l];
      times[l][0] = layer.forward_ms;
      times[l][1] = layer.backward_input_ms;
      times[l][2] = layer.backward_weight_ms;
    }
  }
  times = summed(times, transport);
  if (alone_rate != nullptr) *alone_rate = times[L][0].item<double>();
  if (transport.rank() != 0) {
    profile.source = "rank 0's profile of its layers";
    for (int l = 0; l < L; ++l) {
      LayerProfile layer;
      layer.name = layer_name(options.model, l);
      layer.forward_ms = times[l][0].item<double>();
      layer.backward_input_ms = times[l][1].item<double>();
      layer.backward_weight_ms = times[l][2].item<double>();
      profile.layers.push_back(layer);
    }
  }
  return profile;
}

// The step time the simulator predicts for `plan` in ms: each stage's layer times (measured by
// rank 0 computing alone) stretched to the rate of the slowest rank holding it while all compute
// at once. Transfers count as free.
double predicted_step_ms(const TrainingPlan& plan, const Profile& profile,
                         const WorkersProfile& workers, double alone_rate) {
  CostModel cost = cost_from_profile(profile, plan.stage_layers, /*replicas=*/1);
  double fastest = 0;
  for (const WorkerProfile& w : workers.workers) fastest = std::max(fastest, w.products_per_s);
  const std::vector<double> speeds = stage_speeds(plan, workers.speeds());
  for (size_t s = 0; s < speeds.size(); ++s) {
    const double stretch = alone_rate / (speeds[s] * fastest);
    cost.stage_forward[s] *= stretch;
    cost.stage_backward_input[s] *= stretch;
    cost.stage_backward_weight[s] *= stretch;
  }
  return simulate(plan.schedule, cost, plan.weights, Record::kFigures).makespan;
}

StageLayerOptions layer_options_of(const TrainOptions& options, const TrainingPlan& plan) {
  StageLayerOptions layers;
  layers.model = options.model;
  layers.microbatch_size = plan.microbatch_size;
  layers.ranks = options.pp;
  return layers;
}

}  // namespace

WorkersProfile measure_workers(Transport& transport) {
  const int world = transport.world_size();
  auto figures = torch::zeros({world, 2}, torch::kFloat64);  // [rank] = {products/s, bytes}
  transport.barrier();  // every rank probes during the same window
  figures[transport.rank()][0] = matrix_product_rate(kProbeWindow);
  figures[transport.rank()][1] = cgroup_memory_limit_bytes();
  figures = summed(figures, transport);
  std::vector<double> rates;
  for (int r = 0; r < world; ++r) rates.push_back(figures[r][0].item<double>());
  const std::vector<double> speeds = relative_speeds(rates);
  WorkersProfile workers;
  workers.source = "the measured workers";
  for (int r = 0; r < world; ++r) {
    workers.workers.push_back({r, speeds[r], figures[r][1].item<double>(), rates[r]});
  }
  return workers;
}

std::vector<double> stage_speeds(const TrainingPlan& plan, const std::vector<double>& rank_speeds) {
  PPTRAIN_ASSERT(static_cast<int>(rank_speeds.size()) == plan.world_size());
  std::vector<double> speeds;
  for (int s = 0; s < plan.num_stages(); ++s) {
    double slowest = 0;
    for (int rank : plan.schedule->replicas_of(s)) {
      for (int copy = 0; copy < plan.copies; ++copy) {
        const double speed = rank_speeds[copy * plan.ranks() + rank];
        slowest = slowest == 0 ? speed : std::min(slowest, speed);
      }
    }
    speeds.push_back(slowest);
  }
  return speeds;
}

WorkersCut plan_for_workers(const TrainOptions& options, const TrainingPlan& uniform,
                            Transport& transport) {
  PPTRAIN_CHECK(!uniform.schedule->replicated(), "--partition workers: ", uniform.schedule->name,
                " replicates stages; it takes its cut from a pipedream partition file");
  // The probe computes as the run will: on --threads threads (a BLAS thread that spins on its
  // share of a cgroup's quota counts too).
  set_compute_threads(uniform.threads);
  const WorkersProfile workers = measure_workers(transport);
  const StageLayerOptions layer_options = layer_options_of(options, uniform);
  double alone_rate = 0;
  const Profile profile = shared_layer_profile(layer_options, transport, &alone_rate);
  const std::vector<double> speeds = stage_speeds(uniform, workers.speeds());
  TrainOptions cut = options;
  cut.stage_layers = format_stage_layers(stage_layers_for_speeds(layer_options, profile, speeds));
  TrainingPlan plan = plan_training(cut, /*may_profile=*/false);
  if (transport.rank() == 0) {
    for (const std::string& line : describe_workers(workers)) {
      std::fprintf(stderr, "pptrain: --partition workers: %s\n", line.c_str());
    }
    std::fprintf(stderr, "pptrain: --partition workers: stage layers %s", cut.stage_layers.c_str());
    if (!plan.asynchronous()) {  // the simulator models synchronous schedules
      std::fprintf(stderr, ", predicted step %.1f ms",
                   predicted_step_ms(plan, profile, workers, alone_rate));
    }
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    if (!options.save_workers.empty()) {
      write_text_file(options.save_workers, to_json(workers) + "\n", "--save-workers file");
    }
  }
  return {std::move(plan), profile, workers.speeds()};
}

void train_replanning(const TrainOptions& options, const TrainingPlan& start, Transport& transport,
                      const std::vector<StepObserver*>& observers, const std::string& dir) {
  Profile profile = shared_layer_profile(layer_options_of(options, start), transport, nullptr);
  train_replanning(options, WorkersCut{start, std::move(profile), {}}, transport, observers, dir);
}

void train_replanning(const TrainOptions& options, WorkersCut start, Transport& transport,
                      const std::vector<StepObserver*>& observers, const std::string& dir) {
  TrainingPlan plan = std::move(start.plan);
  std::vector<double> speeds = std::move(start.speeds);
  TrainOptions rest = options;
  for (;;) {
    CutWatch watch{StragglerWatch(start.profile, plan.microbatches(), plan.stage_layers, speeds),
                   dir};
    std::optional<MovedCut> moved = train(plan, transport, observers, &watch);
    if (!moved) break;
    rest.stage_layers = format_stage_layers(moved->replan.ranges);
    rest.resume_dir = moved->dir;
    speeds = moved->replan.speeds;
    plan = plan_training(rest, /*may_profile=*/false);
  }
  transport.barrier();  // every rank has loaded its layers
  if (transport.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace pptrain
