#include "pptrain/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/memory.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/train/agreement.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// What one rank holds: its stages (built from the same per-layer seeds as any other split),
// their parameters with gradients that live from the start (zeroed in place, so a step's memory
// peak counts only what the step allocates), and the optimizer over them.
struct RankModel {
  std::vector<Stage> stages;
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  RankModel(const TrainingPlan& plan, int rank) {
    for (int s : plan.stages_of(rank)) {
      stages.push_back(make_stage(plan.model, s, plan.stage_layers[s]));
      if (!plan.load_dir.empty()) stages.back().load(plan.load_dir);
    }
    for (auto& stage : stages) {
      for (const auto& p : stage.parameters()) params.push_back(p);
    }
    for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
    if (plan.optimizer == "adamw") {
      optimizer = std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(plan.lr).weight_decay(0.01));
    } else {
      optimizer = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(plan.lr).momentum(0.9));
    }
  }

  std::vector<Stage*> stage_pointers() {
    std::vector<Stage*> out;
    for (auto& stage : stages) out.push_back(&stage);
    return out;
  }
};

// The microbatches of one step that this rank reads: inputs on the first stage's rank, targets
// on the last's (both from the same deterministic batch), nothing elsewhere.
class RankData {
 public:
  RankData(const TrainingPlan& plan, int rank)
      : first_(plan.holds_first_stage(rank)),
        last_(plan.holds_last_stage(rank)),
        microbatches_(plan.microbatches()) {
    if (first_ || last_) dataset_.emplace(plan.model, plan.data);
  }
  StepData step(int step) const {
    StepData data;
    if (!dataset_) return data;
    const auto batch = dataset_->batch(step);
    if (first_) data.inputs = Dataset::split(batch.inputs, microbatches_);
    if (last_) data.targets = Dataset::split(batch.targets, microbatches_);
    return data;
  }

 private:
  bool first_, last_;
  int microbatches_;
  std::optional<Dataset> dataset_;
};

// Global gradient norm over every stage's parameters (one all-reduce of the squared norm, summed
// in float64), then scaling to max_norm as torch.nn.utils.clip_grad_norm_ does. Returns the norm
// before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      Transport& transport) {
  torch::NoGradGuard no_grad;
  auto squared = torch::zeros({1}, torch::kFloat64);
  for (const auto& p : params) {
    if (p.grad().defined()) squared += p.grad().to(torch::kFloat64).pow(2).sum();
  }
  transport.allreduce_sum(squared);
  const double norm = std::sqrt(squared.item<double>());
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1) {
      for (const auto& p : params) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  return norm;
}

// A test hook: PPTRAIN_TEST_CRASH_RANK=r PPTRAIN_TEST_CRASH_STEP=k makes rank r abort at the start
// of step k (0-based), to check that the launcher stops the whole run.
void maybe_crash_for_test(int rank, int step) {
  const char* crash_rank = std::getenv("PPTRAIN_TEST_CRASH_RANK");
  const char* crash_step = std::getenv("PPTRAIN_TEST_CRASH_STEP");
  if (crash_rank && crash_step && std::atoi(crash_rank) == rank && std::atoi(crash_step) == step) {
    std::abort();
  }
}

// Why a run stops at a step whose gradients are not finite: the step, the norm, and the loss on
// the rank that computed it.
std::string nonfinite_message(const TrainingPlan& plan, int step, double grad_norm,
                              const StepRecord& record) {
  std::string text =
      "step " + std::to_string(step + 1) + ": the gradient norm is " + std::to_string(grad_norm);
  const int last = plan.schedule->stage_to_rank.back();
  if (record.has_loss) {
    text += " and the loss is " + std::to_string(record.loss) + " on rank " + std::to_string(last);
  } else {
    text += " (the loss is on rank " + std::to_string(last) + ")";
  }
  return text + "; stopped before the optimizer step (a smaller --lr may help; " +
         "--skip-nonfinite skips such steps instead)";
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::vector<StepObserver*> raw_pointers(const std::vector<std::unique_ptr<StepObserver>>& owned) {
  std::vector<StepObserver*> out;
  for (const auto& o : owned) out.push_back(o.get());
  return out;
}

void train(const TrainingPlan& plan, Transport& transport,
           const std::vector<StepObserver*>& observers) {
  install_counting_allocator();
  set_compute_threads(plan.threads);
  const int rank = transport.rank();
  PPTRAIN_CHECK(transport.world_size() == plan.ranks(), "WORLD_SIZE=", transport.world_size(),
                " but the schedule is for --pp ", plan.ranks());
  check_ranks_agree(plan, transport);  // before any message whose shape the plan decides
  RankModel model(plan, rank);
  const RankData data(plan, rank);
  const ModelOptions model_options = plan.model;
  ExecutorOptions executor_options;
  executor_options.rank = rank;
  executor_options.stages = model.stage_pointers();
  executor_options.transport = &transport;
  executor_options.loss = [model_options](const torch::Tensor& output,
                                          const torch::Tensor& target) {
    return compute_loss(model_options, output, target);
  };
  executor_options.boundary_shapes = plan.boundary_shapes;
  executor_options.recompute = plan.recompute;
  Executor executor(plan.schedule, executor_options);
  const bool reports = rank == 0;  // rank 0 gets the step reports
  if (reports) {
    for (StepObserver* o : observers) o->on_start(plan);
  }

  for (int step = 0; step < plan.steps; ++step) {
    maybe_crash_for_test(rank, step);
    const StepData batch = data.step(step);
    for (auto& p : model.params) p.mutable_grad().zero_();
    transport.barrier();  // a common start, so the ranks' timelines line up
    const auto start = Clock::now();
    const int64_t base_bytes = allocated_bytes();
    reset_peak();
    StepRecord record = executor.run_step(batch, start);
    RankStep mine;
    mine.peak_activation_bytes = peak_bytes() - base_bytes;
    const double grad_norm = clip_grad_norm(model.params, plan.clip, transport);
    // Every rank has the same global norm, so every rank takes the same branch.
    if (std::isfinite(grad_norm)) {
      model.optimizer->step();
    } else if (!plan.skip_nonfinite) {
      throw std::runtime_error(nonfinite_message(plan, step, grad_norm, record));
    }
    mine.seconds = seconds_since(start);
    mine.start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
    mine.has_loss = record.has_loss;
    mine.loss = record.loss;
    mine.events = std::move(record.events);
    const auto report = gather_step_report(plan, step, grad_norm, mine, transport);
    if (report) {
      for (StepObserver* o : observers) o->on_step(*report);
    }
  }

  if (!plan.save_dir.empty()) {
    for (const auto& stage : model.stages) stage.save(plan.save_dir);
    transport.barrier();  // every layer is on disk before rank 0 says so
  }
  transport.barrier();
  if (reports) {
    for (StepObserver* o : observers) o->on_end(plan);
  }
}

}  // namespace pptrain
