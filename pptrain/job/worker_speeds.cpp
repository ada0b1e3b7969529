#include "pptrain/job/worker_speeds.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/worker_probe.h"
#include "pptrain/job/trainer.h"
#include "pptrain/partition/partition.h"
#include "pptrain/planner/planner.h"
#include "pptrain/planner/worker_cut.h"
#include "pptrain/runtime/group.h"
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

// What each layer's row of the shared profile holds, in this order.
constexpr double LayerProfile::*kSharedFields[] = {&LayerProfile::forward_ms,
                                                   &LayerProfile::backward_input_ms,
                                                   &LayerProfile::backward_weight_ms,
                                                   &LayerProfile::activation_bytes,
                                                   &LayerProfile::stash_bytes,
                                                   &LayerProfile::parameter_bytes,
                                                   &LayerProfile::weight_stash_bytes,
                                                   &LayerProfile::forward_transient_bytes,
                                                   &LayerProfile::backward_transient_bytes};
constexpr int kSharedColumns = sizeof(kSharedFields) / sizeof(kSharedFields[0]);

// Rank 0's layer profile (times and bytes), the same on every rank: rank 0 measures it while
// the others wait, and, when `alone_rate` is given, its rate of matrix products computing alone,
// the rate its layer times were measured at (for the predicted step time).
Profile shared_layer_profile(const StageLayerOptions& options, Transport& transport,
                             double* alone_rate) {
  Profile profile;
  const int L = num_layers(options.model);
  // [layer] = kSharedFields; [L] = {rate, input_bytes, target_bytes}
  auto table = torch::zeros({L + 1, kSharedColumns}, torch::kFloat64);
  if (transport.rank() == 0) {
    if (alone_rate != nullptr) table[L][0] = matrix_product_rate(kAloneWindow);
    profile = profile_layers(options);
    for (int l = 0; l < L; ++l) {
      for (int c = 0; c < kSharedColumns; ++c) table[l][c] = profile.layers[l].*kSharedFields[c];
    }
    table[L][1] = profile.input_bytes;
    table[L][2] = profile.target_bytes;
  }
  table = summed(table, transport);
  if (alone_rate != nullptr) *alone_rate = table[L][0].item<double>();
  if (transport.rank() != 0) {
    profile.source = "rank 0's profile of its layers";
    profile.microbatch_size = static_cast<int>(options.microbatch_size);
    profile.input_bytes = table[L][1].item<double>();
    profile.target_bytes = table[L][2].item<double>();
    for (int l = 0; l < L; ++l) {
      LayerProfile layer;
      layer.name = layer_name(options.model, l);
      for (int c = 0; c < kSharedColumns; ++c) layer.*kSharedFields[c] = table[l][c].item<double>();
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
  double fastest = 0;
  for (const WorkerProfile& w : workers.workers) fastest = std::max(fastest, w.products_per_s);
  std::vector<double> stretch;
  for (double speed : stage_speeds(plan, workers.speeds())) {
    stretch.push_back(alone_rate / (speed * fastest));
  }
  return predicted_step_ms(plan.schedule, plan.weights, profile, plan.stage_layers, stretch);
}

// The pipeline ranks' memory limits in bytes ([P]): the smallest of each pipeline rank's copies
// (0: none).
std::vector<double> pipeline_limits(const TrainingPlan& plan, const WorkersProfile& workers) {
  std::vector<double> limits(plan.ranks(), 0);
  for (const WorkerProfile& w : workers.workers) {
    double& limit = limits[plan.pipeline_rank(w.rank)];
    if (w.memory_limit_bytes > 0) {
      limit = limit == 0 ? w.memory_limit_bytes : std::min(limit, w.memory_limit_bytes);
    }
  }
  return limits;
}

// The cut for the ranks' speeds kept within each rank's memory limit (planner/worker_cut.h);
// nothing when no rank has a limit, or the run's schedule is not one the planner's memory model
// covers (then says so when `speak`). `what` names the flag in messages.
std::optional<WorkerCut> fit_memory_limits(const TrainOptions& options, const TrainingPlan& plan,
                                           const Profile& profile, const WorkersProfile& workers,
                                           const std::vector<double>& speeds,
                                           const std::vector<LayerRange>& time_cut, bool speak,
                                           const std::string& what = "--partition workers") {
  const std::vector<double> limits = pipeline_limits(plan, workers);
  if (std::all_of(limits.begin(), limits.end(), [](double limit) { return limit == 0; })) {
    return std::nullopt;
  }
  const std::string& name = plan.schedule->name;
  const std::vector<std::string> planned = synchronous_schedules();
  if (!options.schedule_file.empty() || !plan.skips.empty() || name == "zb-auto" ||
      std::find(planned.begin(), planned.end(), name) == planned.end()) {
    if (speak) {
      std::fprintf(stderr,
                   "pptrain: --partition workers: the memory limits are not checked: the "
                   "planner's memory model does not cover %s\n",
                   options.schedule_file.empty() ? name.c_str() : "a --schedule-file");
    }
    return std::nullopt;
  }
  WorkerCutRequest request;
  request.profile = profile;
  request.planner.workers = plan.ranks();
  request.planner.rank_memory_limits = limits;
  request.planner.microbatches = {plan.microbatches()};
  request.planner.profile_microbatch_size = static_cast<int>(plan.microbatch_size);
  request.planner.batch_size = static_cast<int>(plan.microbatch_size) * plan.microbatches();
  request.planner.optimizer_state_factor = optimizer_state_factor(options.optimizer);
  request.planner.mem_w_ratio = options.mem_w_ratio;
  request.shape.schedule = name;
  request.shape.chunks = plan.schedule->chunks();
  request.shape.microbatches = plan.microbatches();
  request.shape.recompute = plan.recompute;
  request.stage_speeds = speeds;
  request.time_cut = time_cut;
  request.gradient_buffers = plan.copies > 1;
  request.what = what;
  return fit_cut_to_workers(request);
}

StageLayerOptions layer_options_of(const TrainOptions& options, const TrainingPlan& plan) {
  StageLayerOptions layers;
  layers.model = options.model;
  layers.microbatch_size = plan.microbatch_size;
  layers.ranks = options.pp;
  return layers;
}

// The workers as the run's ranks see them when `placement` runs rank r on worker placement[r]:
// [rank] = that worker's figures.
WorkersProfile placed(const WorkersProfile& workers, const std::vector<int>& placement) {
  if (placement.empty()) return workers;
  WorkersProfile out = workers;
  for (size_t r = 0; r < placement.size(); ++r) {
    out.workers[r] = workers.workers[placement[r]];
    out.workers[r].rank = static_cast<int>(r);
  }
  return out;
}

// The placements tried (kMaxPlacements): the user's; else, for one pipeline, every order of the
// workers that differs in what the ranks get (speed and limit), the identity first; else the
// identity.
constexpr int kMaxPlacements = 720;  // 6!: every order of 6 unequal workers
std::vector<std::vector<int>> placements_to_try(const TrainingPlan& uniform,
                                                const WorkersProfile& workers) {
  const int world = uniform.world_size();
  std::vector<int> identity(world);
  for (int r = 0; r < world; ++r) identity[r] = r;
  if (!uniform.placement.empty()) return {uniform.placement};
  if (uniform.copies > 1) return {identity};
  std::vector<std::vector<int>> out;
  std::set<std::vector<std::pair<double, double>>> seen;  // what each rank gets
  std::vector<int> order = identity;
  long long tried = 0;
  do {
    std::vector<std::pair<double, double>> gets;
    for (int w : order) {
      gets.emplace_back(workers.workers[w].speed, workers.workers[w].memory_limit_bytes);
    }
    if (seen.insert(gets).second) out.push_back(order);
    if (++tried > 40320) break;  // 8!: more workers keep the first orders only
  } while (std::next_permutation(order.begin(), order.end()) &&
           static_cast<int>(out.size()) < kMaxPlacements);
  return out;
}

// A cut with the placement it is for.
struct PlacedCut {
  std::vector<int> placement;            // [rank] = worker
  WorkersProfile workers;                // placed: [rank] = its worker's figures
  std::vector<LayerRange> stage_layers;  // [stage]
  std::vector<double> peak_bytes;        // [rank] predicted; empty: no limit checked
  double slowest_stage_ms = 0;
};

// What another placement must gain on the slowest stage to be taken: measured speeds differ by a
// few percent between equal workers, which must not move ranks.
constexpr double kPlacementGain = 0.03;

// Of the placements to try, the one whose cut (for its speeds, within its limits) has the
// fastest slowest stage, by more than kPlacementGain over the earlier ones (the identity first,
// so equal workers keep it). UserError
// (the first placement's, or the identity's) when no placement has a cut that fits.
PlacedCut choose_placed_cut(const TrainOptions& options, const TrainingPlan& uniform,
                            const Profile& profile, const WorkersProfile& workers,
                            const StageLayerOptions& layer_options, bool speak,
                            const std::string& what = "--partition workers") {
  std::optional<PlacedCut> best;
  std::optional<UserError> first_error;
  for (const std::vector<int>& placement : placements_to_try(uniform, workers)) {
    PlacedCut c;
    c.placement = placement;
    c.workers = placed(workers, placement);
    const std::vector<double> speeds = stage_speeds(uniform, c.workers.speeds());
    const std::vector<LayerRange> time_cut =
        stage_layers_for_speeds(layer_options, profile, speeds);
    std::optional<WorkerCut> fitted;
    try {
      fitted =
          fit_memory_limits(options, uniform, profile, c.workers, speeds, time_cut, speak, what);
    } catch (const UserError& e) {
      if (!first_error) first_error = e;
      continue;
    }
    speak = false;  // the note that limits are not checked is said once
    c.stage_layers = fitted ? fitted->stage_layers : time_cut;
    if (fitted) c.peak_bytes = fitted->peak_bytes;
    c.slowest_stage_ms = slowest_stage_ms(profile, c.stage_layers, speeds);
    if (!best || c.slowest_stage_ms < best->slowest_stage_ms * (1 - kPlacementGain)) {
      best = std::move(c);
    }
  }
  if (!best) throw *first_error;
  return *best;
}

// A cut for --dp copies with each copy's share of the batch (empty: equal shares), and the step
// it makes (planner.h: DpShares::step).
struct CopiesCut {
  std::vector<LayerRange> stage_layers;
  DpShares shares;
};

// --dp D on unequal workers: how to give the copies holding slower ranks fewer samples
// (planner.h: dp_shares_for, equal shares unless others end a step more than 3% sooner). The
// cut is `best`'s (each stage cut for its slowest copy), or the time cut for one copy's own
// speeds when that, with its shares, ends a step more than 3% sooner: a slow rank in one copy
// need not hold back the cut of the others. `best` as it is (equal shares) when the user gave
// --dp-shares, when the copies average as equals (avgpipe), or when a memory limit was kept (the
// memory model plans one microbatch size for every copy).
CopiesCut cut_for_copies(const TrainOptions& options, const TrainingPlan& uniform,
                         const Profile& profile, const PlacedCut& best,
                         const StageLayerOptions& layer_options) {
  if (uniform.copies == 1 || !options.dp_shares.empty() || uniform.averages_copies ||
      !best.peak_bytes.empty()) {
    return {best.stage_layers, {}};
  }
  const std::vector<double> speeds = best.workers.speeds();
  const auto with_shares = [&](const std::vector<LayerRange>& cut) {
    return CopiesCut{cut, dp_shares_for(profile, cut, uniform.schedule->stage_to_rank, speeds,
                                        options.data.batch_size, options.data.microbatches)};
  };
  CopiesCut chosen = with_shares(best.stage_layers);
  const int P = uniform.ranks();
  for (int d = 0; d < uniform.copies; ++d) {
    // Every copy as copy d: each stage's speed is then copy d's rank's.
    std::vector<double> as_copy_d;
    for (int c = 0; c < uniform.copies; ++c) {
      as_copy_d.insert(as_copy_d.end(), speeds.begin() + d * P, speeds.begin() + (d + 1) * P);
    }
    CopiesCut other = with_shares(
        stage_layers_for_speeds(layer_options, profile, stage_speeds(uniform, as_copy_d)));
    if (other.shares.step < chosen.shares.step * (1 - kDpSharesGain)) chosen = std::move(other);
  }
  return chosen;
}

// predicted_step_ms() with unequal shares: each copy simulated at its own microbatch size (the
// profile's times scaled linearly from its size) on its own ranks' speeds; the step is the
// slowest copy's.
double predicted_copies_step_ms(const TrainingPlan& plan, const Profile& profile,
                                const WorkersProfile& workers, double alone_rate) {
  double fastest = 0;
  for (const WorkerProfile& w : workers.workers) fastest = std::max(fastest, w.products_per_s);
  const std::vector<double> speeds = workers.speeds();
  double slowest = 0;
  for (int d = 0; d < plan.copies; ++d) {
    CostModel cost = cost_from_profile(profile, plan.stage_layers, /*replicas=*/1);
    const double size =
        static_cast<double>(plan.copy_microbatch_size(d)) / std::max(profile.microbatch_size, 1);
    for (int s = 0; s < plan.num_stages(); ++s) {
      const double speed = speeds[d * plan.ranks() + plan.schedule->stage_to_rank[s]];
      const double stretch = size * alone_rate / (speed * fastest);
      cost.stage_forward[s] *= stretch;
      cost.stage_backward_input[s] *= stretch;
      cost.stage_backward_weight[s] *= stretch;
    }
    slowest =
        std::max(slowest, simulate(plan.schedule, cost, plan.weights, Record::kFigures).makespan);
  }
  return slowest;
}

}  // namespace

WorkersProfile measure_workers(Transport& transport, double memory_limit_bytes) {
  const int world = transport.world_size();
  auto figures = torch::zeros({world, 2}, torch::kFloat64);  // [rank] = {products/s, bytes}
  transport.barrier();  // every rank probes during the same window
  figures[transport.rank()][0] = matrix_product_rate(kProbeWindow);
  figures[transport.rank()][1] =
      memory_limit_bytes > 0 ? memory_limit_bytes : cgroup_memory_limit_bytes();
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
  const double own_limit = options.worker_memory_limits.empty()
                               ? 0
                               : parse_worker_memory_limits(options.worker_memory_limits,
                                                            uniform.world_size())[transport.rank()];
  const WorkersProfile workers = measure_workers(transport, own_limit);
  const StageLayerOptions layer_options = layer_options_of(options, uniform);
  double alone_rate = 0;
  const Profile profile = shared_layer_profile(layer_options, transport, &alone_rate);
  // Every rank makes the same choice from the same figures, so a cut that fits no rank's limit
  // is the same one-line error everywhere, before any stage is built (and before any line).
  const PlacedCut best =
      choose_placed_cut(options, uniform, profile, workers, layer_options, transport.rank() == 0);
  const CopiesCut copies = cut_for_copies(options, uniform, profile, best, layer_options);
  TrainOptions cut = options;
  cut.stage_layers = format_stage_layers(copies.stage_layers);
  cut.placement = format_placement(best.placement);
  if (!copies.shares.shares.empty()) cut.dp_shares = format_dp_shares(copies.shares.shares);
  TrainingPlan plan = plan_training(cut, /*may_profile=*/false);
  if (transport.rank() == 0) {
    for (const std::string& line : describe_workers(workers)) {
      std::fprintf(stderr, "pptrain: --partition workers: %s\n", line.c_str());
    }
    std::fprintf(stderr, "pptrain: --partition workers: stage layers %s", cut.stage_layers.c_str());
    if (!is_identity(best.placement)) {
      std::fprintf(stderr, ", placement %s", cut.placement.c_str());
    }
    if (!plan.dp_shares.empty()) std::fprintf(stderr, ", shares %s", cut.dp_shares.c_str());
    if (!best.peak_bytes.empty()) {
      std::string peaks;
      for (double bytes : best.peak_bytes) peaks += (peaks.empty() ? "" : " ") + megabytes(bytes);
      std::fprintf(stderr, ", predicted peaks %s", peaks.c_str());
    }
    if (!plan.asynchronous()) {  // the simulator models synchronous schedules
      std::fprintf(stderr, ", predicted step %.1f ms",
                   plan.dp_shares.empty()
                       ? predicted_step_ms(plan, profile, best.workers, alone_rate)
                       : predicted_copies_step_ms(plan, profile, best.workers, alone_rate));
    }
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    if (!options.save_workers.empty()) {
      write_text_file(options.save_workers, to_json(workers) + "\n", "--save-workers file");
    }
  }
  return {std::move(plan), profile, best.workers.speeds()};
}

namespace {

// Each process's memory limit, as --partition workers reads it (--worker-memory-limits where it
// gives one, else the cgroup's), and a speed of 1 (collective): [worker].
WorkersProfile memory_limits_of(const TrainOptions& options, Transport& processes) {
  const int world = processes.world_size();
  const double given =
      options.worker_memory_limits.empty()
          ? 0
          : parse_worker_memory_limits(options.worker_memory_limits, world)[processes.rank()];
  auto limits = torch::zeros({world}, torch::kFloat64);
  limits[processes.rank()] = given > 0 ? given : cgroup_memory_limit_bytes();
  limits = summed(limits, processes);
  WorkersProfile workers;
  workers.source = "the workers' memory limits";
  for (int w = 0; w < world; ++w) workers.workers.push_back({w, 1, limits[w].item<double>(), 0});
  return workers;
}

// [rank] = the worker that plays it under `plan`: its placement, or the identity.
std::vector<int> placement_of(const TrainingPlan& plan) {
  if (!plan.placement.empty()) return plan.placement;
  std::vector<int> identity(plan.world_size());
  std::iota(identity.begin(), identity.end(), 0);
  return identity;
}

}  // namespace

void cut_for_replan(const TrainOptions& options, const TrainingPlan& uniform,
                    const Profile& profile, const WorkersProfile& workers,
                    const std::vector<int>& placement, Replan& replan) {
  std::vector<int> current = placement;
  if (current.empty()) {
    current.resize(replan.speeds.size());
    std::iota(current.begin(), current.end(), 0);
  }
  WorkersProfile now = workers;
  for (size_t r = 0; r < current.size(); ++r) now.workers[current[r]].speed = replan.speeds[r];
  PlacedCut best;
  try {
    best = choose_placed_cut(options, uniform, profile, now, layer_options_of(options, uniform),
                             /*speak=*/false, /*what=*/"");
  } catch (const UserError& e) {
    replan.kept = e.what();
    return;
  }
  replan.ranges = best.stage_layers;
  replan.after_s = best.slowest_stage_ms * uniform.microbatches() / 1000;
  if (best.placement != current) replan.placement = best.placement;
}

void train_replanning(const TrainOptions& options, const TrainingPlan& uniform,
                      std::optional<WorkersCut> start, Transport& processes,
                      const std::vector<StepObserver*>& observers, const std::string& dir) {
  WorkersProfile workers = memory_limits_of(options, processes);
  if (!start) {
    Profile profile = shared_layer_profile(layer_options_of(options, uniform), processes, nullptr);
    start = WorkersCut{uniform, std::move(profile), {}};
  }
  const Profile& profile = start->profile;
  TrainingPlan plan = std::move(start->plan);
  // The workers' speeds the cut was made for.
  const std::vector<int> first = placement_of(plan);
  for (size_t r = 0; r < start->speeds.size(); ++r) {
    workers.workers[first[r]].speed = start->speeds[r];
  }
  TrainOptions rest = options;
  for (;;) {
    const std::vector<int> placement = placement_of(plan);
    std::vector<double> speeds;  // [rank]
    for (int worker : placement) speeds.push_back(workers.workers[worker].speed);
    const Cutter cut = [&options, &uniform, &profile, &workers, placement](Replan& replan) {
      cut_for_replan(options, uniform, profile, workers, placement, replan);
    };
    CutWatch watch{StragglerWatch(profile, plan.microbatches(), plan.stage_layers, speeds, cut),
                   dir, processes.rank()};
    std::unique_ptr<Transport> transport = placed_view(processes, placement);
    std::optional<MovedCut> moved = train(plan, *transport, observers, &watch);
    if (!moved) break;
    for (size_t r = 0; r < placement.size(); ++r) {
      workers.workers[placement[r]].speed = moved->replan.speeds[r];
    }
    rest.stage_layers = format_stage_layers(moved->replan.ranges);
    rest.placement =
        format_placement(moved->replan.placement.empty() ? placement : moved->replan.placement);
    rest.resume_dir = moved->dir;
    plan = plan_training(rest, /*may_profile=*/false);
  }
  processes.barrier();  // every rank has loaded its layers
  if (processes.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace pptrain
