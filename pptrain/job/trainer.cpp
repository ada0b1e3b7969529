#include "pptrain/job/trainer.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "pptrain/api/pipeline.h"
#include "pptrain/common/check.h"
#include "pptrain/data/data.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/placement.h"
#include "pptrain/runtime/cluster_env.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/train/agreement.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/report.h"

namespace pptrain {
namespace {

// A test hook: PPTRAIN_TEST_CRASH_RANK=r PPTRAIN_TEST_CRASH_STEP=k makes rank r abort at the start
// of step k (0-based), to check that the launcher stops the whole run.
void maybe_crash_for_test(int rank, int step) {
  const char* crash_rank = std::getenv("PPTRAIN_TEST_CRASH_RANK");
  const char* crash_step = std::getenv("PPTRAIN_TEST_CRASH_STEP");
  if (crash_rank && crash_step && std::atoi(crash_rank) == rank && std::atoi(crash_step) == step) {
    // PPTRAIN_TEST_CRASH_ONCE=FILE: only when FILE is not there yet (it is made now), so that a
    // restarted run gets past the step.
    const char* once = std::getenv("PPTRAIN_TEST_CRASH_ONCE");
    if (once && *once) {
      if (std::filesystem::exists(once)) return;
      std::ofstream(once) << "crashed\n";
    }
    std::abort();
  }
}

// A test hook: PPTRAIN_TEST_SLOW_WORKER=w PPTRAIN_TEST_SLOW_STEP=k PPTRAIN_TEST_SLOW_FACTOR=x
// makes every process tell --replan auto's watch that its rank computed what the cut expects of
// it, and the process of worker w, from step k (0-based) on, x times that, whichever rank it
// plays: a straggler as the watch sees one, without a machine to slow, and without the noise of
// a loaded machine's real times.
double compute_as_watched(double compute_s, const StragglerWatch& watch, int rank, int worker,
                          int step) {
  const char* slow_worker = std::getenv("PPTRAIN_TEST_SLOW_WORKER");
  const char* slow_step = std::getenv("PPTRAIN_TEST_SLOW_STEP");
  const char* factor = std::getenv("PPTRAIN_TEST_SLOW_FACTOR");
  if (!slow_worker || !slow_step || !factor) return compute_s;
  const bool slow = std::atoi(slow_worker) == worker && step >= std::atoi(slow_step);
  return watch.profiled_s(rank) * (slow ? std::atof(factor) : 1.0);
}

// The schedule's options that the plan decided.
PipelineOptions pipeline_options(const TrainingPlan& plan,
                                 const std::vector<StepObserver*>& observers) {
  PipelineOptions options;
  options.planned = PlannedSchedule{plan.schedule, plan.weights, plan.averages_copies};
  options.microbatches = plan.microbatches();
  options.weight_split = plan.autograd_weight_split ? ExecutorOptions::WeightSplit::kAutograd
                                                    : ExecutorOptions::WeightSplit::kDeferredLayers;
  options.recompute = plan.recompute;
  options.precision = plan.precision;
  options.casts_per_step = plan.casts_per_step;
  options.data_parallel = plan.copies;
  options.data_parallel_shares = plan.dp_shares;
  options.zero = plan.zero;
  options.optimizer = plan.optimizer;
  options.family = plan.family;
  options.observers = observers;
  options.steps = plan.steps;
  options.first_step = plan.first_step;
  options.tokens_per_sample = plan.tokens_per_sample;
  options.run_info = run_info(plan);
  options.tied = plan.ties;    // --tie-embeddings
  options.skips = plan.skips;  // unet's, between stages
  return options;
}

// The tied copies a checkpoint stores with their first copy, not in their own layer's file:
// every one but layer 0's (the model ties gpt's head to the embedding); the schedule then makes
// them equal to it (PipelineOptions::tied).
LeftOut stored_elsewhere(const ModelOptions& model, const Stage& stage) {
  LeftOut out;
  for (int i = 0; i < stage.num_layers(); ++i) {
    const int layer = stage.first_layer() + i;
    if (layer == 0) continue;
    for (const auto& [name, tensor] : tied_parameters(model, layer, *stage.layers()[i].ptr())) {
      out[layer].push_back(stage.find_parameter(tensor).second);
    }
  }
  return out;
}

}  // namespace

std::vector<StepObserver*> raw_pointers(const std::vector<std::unique_ptr<StepObserver>>& owned) {
  std::vector<StepObserver*> out;
  for (const auto& o : owned) out.push_back(o.get());
  return out;
}

std::optional<MovedCut> train(const TrainingPlan& plan, Transport& transport,
                              const std::vector<StepObserver*>& observers, CutWatch* watch) {
  set_compute_threads(plan.threads);
  const int rank = transport.rank();  // in the world: D copies of the P-rank pipeline
  PPTRAIN_CHECK(transport.world_size() == plan.world_size(), "WORLD_SIZE=", transport.world_size(),
                " but the run is for --pp ", plan.ranks(), " x --dp ", plan.copies);
  check_ranks_agree(plan, transport);  // before any message whose shape the plan decides
  const int pipeline_rank = plan.pipeline_rank(rank);

  // This rank's stages, each built from the same per-layer seeds as in any other split.
  std::vector<std::unique_ptr<PipelineStage>> stages;
  std::vector<PipelineStage*> pointers;
  for (int s : plan.stages_of(pipeline_rank)) {
    const ModelOptions& model = plan.model;
    const LayerRange layers = plan.stage_layers[s];
    Stage stage = make_stage(model, s, layers);
    if (!plan.start_dir().empty()) stage.load(plan.start_dir(), stored_elsewhere(model, stage));
    stages.push_back(std::make_unique<PipelineStage>(
        std::move(stage), plan.num_stages(),
        [model, s, layers] { return make_stage(model, s, layers); }));
    PipelineStage& built = *stages.back();
    for (int i = 0; i < built.stage().num_layers(); ++i) {
      const int layer = built.stage().first_layer() + i;
      for (auto& [name, tensor] : tied_parameters(model, layer, *built.stage().layers()[i].ptr())) {
        built.tie(name, tensor);
      }
    }
    pointers.push_back(stages.back().get());
  }
  // This rank's device (device/placement.h); the schedule moves the stages there.
  const RankDevice device =
      decide_device(plan.device, cluster_env_of_process().local_rank, plan.precision);
  const ModelOptions model = plan.model;
  const LossFn loss = [model](const torch::Tensor& output, const torch::Tensor& target) {
    return compute_loss(model, output, target);
  };
  // The schedule needs a World; the transport is the caller's.
  World world{rank, transport.world_size(),
              std::shared_ptr<Transport>(&transport, [](Transport*) {})};
  // Checkpoints are saved at the end of a step, inside it, so that its report carries the time
  // the step loop waited for them (checkpoint_stall_s).
  CheckpointWriter writer(plan, transport);
  std::optional<RankCheckpoint> to_save;
  PipelineOptions options = pipeline_options(plan, observers);
  options.device = device.device;
  if (device.device.is_cuda() && options.run_info) {
    options.run_info->header += "\ndevice: rank " + std::to_string(rank) + " on " +
                                device.description + "; each rank on the GPU of its LOCAL_RANK";
  }
  // After --replan auto moved the layers, the run goes on: whichever process reports now appends.
  options.run_info->continues = watch != nullptr && plan.resume_dir == watch->dir;
  options.at_step_end = [&plan, &writer, &to_save](int done) {
    if (plan.save_dir.empty()) return 0.0;
    if (done == plan.steps) return writer.save(*to_save, done) + writer.wait();
    if (plan.save_every > 0 && done % plan.save_every == 0) return writer.save(*to_save, done);
    writer.check();
    return 0.0;
  };
  PipelineSchedule schedule(world, pointers, options, loss);
  if (!plan.resume_dir.empty()) schedule.resume_from(plan.resume_dir);

  // The batch of step k is the same on every rank (a function of the seed and k); copy d of D
  // pipelines takes its d-th share of it (--dp-shares: rows after the shares of copies 0..d-1).
  // Only the ranks holding the first or the last stage read it.
  std::optional<Dataset> dataset;
  if (plan.holds_first_stage(pipeline_rank) || plan.holds_last_stage(pipeline_rank)) {
    dataset.emplace(plan.model, plan.data);
  }
  const int copy = plan.copy_of(rank);
  const int64_t first = plan.copy_first_sample(copy), rows = plan.copy_samples(copy);
  const BatchSource batches = [&dataset, first, rows](int step) {
    const auto batch = dataset->batch(step);
    const auto share = [first, rows](const torch::Tensor& t) { return t.narrow(0, first, rows); };
    return Batch{share(batch.inputs), share(batch.targets)};
  };

  if (!plan.save_dir.empty()) to_save = schedule.checkpoint();
  for (int step = plan.first_step; step < plan.steps; ++step) {
    maybe_crash_for_test(rank, step);
    schedule.step(batches);
    if (watch == nullptr || step + 1 == plan.steps) continue;
    auto times = torch::zeros({transport.world_size()}, torch::kFloat64);
    times[rank] =
        compute_as_watched(schedule.last_compute_wall_s(), watch->watch, rank, watch->worker, step);
    transport.allreduce_sum_async(times).wait();
    std::vector<double> compute_s;
    for (int r = 0; r < transport.world_size(); ++r) compute_s.push_back(times[r].item<double>());
    std::optional<Replan> replan = watch->watch.observe(compute_s);
    if (!replan) continue;
    if (rank == 0) {  // the move, or why the cut stays
      std::fprintf(stderr, "pptrain: --replan auto after step %d: %s\n", step + 1,
                   describe_replan(*replan, plan.stage_layers).c_str());
      std::fflush(stderr);
    }
    if (!replan->kept.empty()) continue;
    // Every rank got the same times, so every rank moves here.
    writer.wait();
    TrainingPlan moving = plan;
    moving.save_dir = watch->dir;
    moving.keep = 1;
    save_checkpoint(moving, schedule.checkpoint(), step + 1, transport);
    schedule.abandon();
    return MovedCut{step + 1, std::move(*replan), watch->dir};
  }
  schedule.finish();
  return std::nullopt;
}

}  // namespace pptrain
