#include "pptrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/memory.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/stage_versions.h"
#include "pptrain/train/agreement.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/control_tags.h"
#include "pptrain/train/optimizer.h"
#include "pptrain/train/pipemare.h"
#include "pptrain/train/stage_copies.h"
#include "pptrain/train/weight_prediction.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// What one rank holds: its stages (built from the same per-layer seeds as any other split),
// their parameters with gradients that live from the start (zeroed in place, so a step's memory
// peak counts only what the step allocates), one optimizer per stage (stages of an asynchronous
// schedule step at different times), each stage's weight versions, and pipemare's fixes.
struct RankModel {
  std::vector<Stage> stages;
  std::vector<torch::Tensor> params;
  std::vector<StageOptimizer> optimizers;     // [local stage]
  std::vector<StageVersions> versions;        // [local stage]
  std::vector<PipeMareStage> pipemare;        // [local stage], for a pipemare rule only
  std::vector<WeightPrediction> predictions;  // [local stage], for a predicting rule only
  std::map<int, int> local;                   // global stage index -> local stage
  std::map<int, int> owner;  // --zero 1: model layer -> the copy that keeps its optimizer state

  // `world_rank` runs pipeline rank plan.pipeline_rank(world_rank) of copy plan.copy_of(...).
  RankModel(const TrainingPlan& plan, int world_rank) {
    for (int s : plan.stages_of(plan.pipeline_rank(world_rank))) {
      local[s] = static_cast<int>(stages.size());
      stages.push_back(make_stage(plan.model, s, plan.stage_layers[s]));
      if (!plan.start_dir().empty()) stages.back().load(plan.start_dir());
    }
    if (plan.zero == 1) {
      std::vector<int> layers;
      std::vector<int64_t> numel;
      for (const auto& stage : stages) {
        for (int i = 0; i < stage.num_layers(); ++i) {
          layers.push_back(stage.first_layer() + i);
          numel.push_back(0);
          for (const auto& p : stage.layer_parameters(i)) numel.back() += p.numel();
        }
      }
      const std::vector<int> owners = zero_owners(numel, plan.copies);
      for (size_t i = 0; i < layers.size(); ++i) owner[layers[i]] = owners[i];
    }
    const int replica = plan.copy_of(world_rank);
    const auto keeps = [this, replica](int layer) {
      return owner.empty() || owner.at(layer) == replica;
    };
    for (auto& stage : stages) {
      auto stage_params = stage.parameters();
      for (auto& p : stage_params) p.mutable_grad() = torch::zeros_like(p);
      params.insert(params.end(), stage_params.begin(), stage_params.end());
      optimizers.emplace_back(plan, stage, keeps);
      if (!plan.resume_dir.empty()) optimizers.back().load(plan.resume_dir);
      const int s = stage.index();
      auto make_copy = [&plan, s] { return make_stage(plan.model, s, plan.stage_layers[s]); };
      // The one-process run of an asynchronous rule (one rank, stages in turn) runs later
      // forwards than the pipeline before the same backwards, so it may need versions the
      // pipeline never holds at once: it always keeps them as snapshots.
      const bool serial = plan.ranks() == 1 && plan.asynchronous();
      // A predicting rule's extra copies are predictions (WeightPrediction), not stashed
      // versions: its pipeline computes on the live weights.
      const bool stashes = !plan.weights.predicts() && plan.weights.versions_kept(s) > 1;
      versions.emplace_back(&stage, make_copy, /*snapshots=*/serial || stashes);
      if (plan.weights.update == WeightUpdate::kPipeMare) {
        pipemare.emplace_back(&stage, make_copy, plan.weights.delay(s), plan.pipemare);
      }
      if (plan.weights.predicts()) predictions.emplace_back(plan.weights, s, make_copy);
    }
  }

  std::vector<Stage*> stage_pointers() {
    std::vector<Stage*> out;
    for (auto& stage : stages) out.push_back(&stage);
    return out;
  }
};

// The microbatches of one step that this rank reads: inputs on the first stage's rank, targets
// on the last's (both from the same deterministic batch, copy d of D pipelines taking its d-th
// share of it), nothing elsewhere.
class RankData {
 public:
  RankData(const TrainingPlan& plan, int world_rank)
      : first_(plan.holds_first_stage(plan.pipeline_rank(world_rank))),
        last_(plan.holds_last_stage(plan.pipeline_rank(world_rank))),
        replica_(plan.copy_of(world_rank)),
        copies_(plan.copies),
        microbatches_(plan.microbatches()),
        // An asynchronous pipeline's first stage runs S-1 forwards ahead, into later steps.
        ahead_(plan.asynchronous() ? (plan.num_stages() - 1 + microbatches_ - 1) / microbatches_
                                   : 0) {
    if (first_ || last_) dataset_.emplace(plan.model, plan.data);
  }
  // Step `step`'s microbatches, numbered 0 .. M-1. In an asynchronous pipeline, which runs
  // forwards of later steps already, also theirs, and numbered from step x M as the run-long
  // schedule numbers them.
  StepData step(int step, bool asynchronous, int steps) const {
    StepData data;
    data.first_microbatch = asynchronous ? step * microbatches_ : 0;
    if (!dataset_) return data;
    for (int k = step; k < std::min(steps, step + 1 + ahead_); ++k) {
      const auto batch = dataset_->batch(k);
      if (first_) {
        for (auto& x : Dataset::split(share(batch.inputs), microbatches_)) data.inputs.push_back(x);
      }
      if (last_) {
        for (auto& y : Dataset::split(share(batch.targets), microbatches_)) {
          data.targets.push_back(y);
        }
      }
    }
    return data;
  }

 private:
  // This copy's rows of the global batch [N, ...]: [N/D, ...].
  torch::Tensor share(const torch::Tensor& batch) const {
    const int64_t rows = batch.size(0) / copies_;
    return batch.narrow(0, replica_ * rows, rows);
  }

  bool first_, last_;
  int replica_, copies_;
  int microbatches_;
  int ahead_;  // later steps whose microbatches a step's segment may use
  std::optional<Dataset> dataset_;
};

// The sum of the squared norms of the parameters' gradients, in float64, without a temporary
// copy of any gradient (an asynchronous schedule takes this after every microbatch).
double squared_grad_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    const double norm = p.grad().norm().item<double>();
    sum += norm * norm;
  }
  return sum;
}

// Whether a global gradient norm calls for clipping to max_norm (as
// torch.nn.utils.clip_grad_norm_ decides it) or is not finite: what post-validation checks.
bool clips_or_skips(double norm, double max_norm) {
  return !std::isfinite(norm) || (max_norm > 0 && max_norm / (norm + 1e-6) < 1);
}

// Scales the gradients to max_norm when their global norm is above it, as
// torch.nn.utils.clip_grad_norm_ does.
void scale_to_max_norm(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

// Gradient norm over every stage's parameters (with a transport, one all-reduce of the squared
// norm, summed in float64, makes it global), then scaling to max_norm. Returns the norm before
// clipping. `counted`: the parameters whose norm this rank adds, when not all of `params` (a
// replicated stage's gradients are counted by one of its replicas only).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      Transport* transport, const std::vector<torch::Tensor>* counted = nullptr) {
  auto squared = torch::full({1}, squared_grad_norm(counted ? *counted : params), torch::kFloat64);
  if (transport) transport->allreduce_sum(squared);
  const double norm = std::sqrt(squared.item<double>());
  scale_to_max_norm(params, norm, max_norm);
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

// Bytes of a stage's parameters: one copy of its weights.
int64_t parameter_bytes(const Stage& stage) {
  int64_t bytes = 0;
  for (const auto& p : stage.parameters()) bytes += tensor_bytes(p);
  return bytes;
}

// The optimizer steps of an asynchronous schedule, run by the executor after each backward.
// When the rule says the stage steps, the gradients summed on the version the backwards since
// its last step used (one version: every rule has a step's backwards on one) go to the live
// weights, the stage clips its own gradient norm (no other stage has finished the same step),
// steps, and keeps or frees versions as the rule needs them.
class AsyncUpdates {
 public:
  AsyncUpdates(const TrainingPlan& plan, RankModel& model) : plan_(plan), model_(model) {}

  Stage& weights(int stage, int mb, bool backward) {
    const VersionRule& rule = plan_.weights;
    const int version =
        backward ? rule.backward_version(mb, stage) : rule.forward_version(mb, stage);
    const int l = model_.local.at(stage);
    StageVersions& versions = model_.versions[l];
    if (!model_.predictions.empty()) {
      Stage& predicted = model_.predictions[l].weights(mb, backward, versions);
      note_held(l);
      return predicted;
    }
    Stage& weights = versions.weights(version);
    note_held(l);
    if (!backward || model_.pipemare.empty()) return weights;
    return model_.pipemare[l].backward_weights(weights, version - rule.forward_version(mb, stage));
  }

  void after_backward(int stage, int mb) {
    const VersionRule& rule = plan_.weights;
    const int l = model_.local.at(stage);
    StageVersions& versions = model_.versions[l];
    const int version = rule.backward_version(mb, stage);
    if (!model_.pipemare.empty()) model_.pipemare[l].gradients_to(versions.weights(version));
    if (!model_.predictions.empty()) {
      model_.predictions[l].gradients_to(versions.weights(version));
    }
    auto [pending, fresh] = pending_version_.emplace(stage, version);
    PPTRAIN_ASSERT(fresh || pending->second == version, "stage ", stage,
                   " summed gradients of versions ", pending->second, " and ", version);
    if (!rule.steps_after(mb)) return;
    pending_version_.erase(stage);
    versions.gradients_to_live(version);
    const int oldest = rule.oldest_needed_after(mb, stage);
    if (versions.live_version() >= oldest) versions.weights(versions.live_version());
    note_held(l);
    versions.release_older_than(oldest);
    const auto params = model_.stages[l].parameters();
    const double norm = clip_grad_norm(params, plan_.clip, nullptr);  // this stage's own
    latest_squared_[stage] = norm * norm;
    if (std::isfinite(norm)) {
      step(l, mb / rule.microbatches_per_step);
    } else if (!plan_.skip_nonfinite) {
      throw std::runtime_error("step " + std::to_string(mb / rule.microbatches_per_step + 1) +
                               ": the gradient norm of stage " + std::to_string(stage) + " is " +
                               std::to_string(norm) + " after microbatch " + std::to_string(mb) +
                               "; stopped before its optimizer step (a smaller --lr may help; "
                               "--skip-nonfinite skips such steps instead)");
    }
    for (auto& p : params) p.mutable_grad().zero_();
    versions.stepped();
    note_held(l);
    if (!model_.predictions.empty()) {
      WeightPrediction& prediction = model_.predictions[l];
      prediction.record(versions.live_version(), model_.optimizers[l].direction(model_.stages[l]),
                        plan_.lr_at(mb / rule.microbatches_per_step));
      prediction.release_older_than(oldest);
    }
  }

  // The optimizer step of local stage l in step `step` (0-based); pipemare's fixes around it
  // (its stages take their k-th step in step k).
  void step(int l, int step) {
    StageOptimizer& optimizer = model_.optimizers[l];
    if (model_.pipemare.empty()) {
      optimizer.set_lr(plan_.lr_at(step));
      optimizer.step();
      return;
    }
    PipeMareStage& fixes = model_.pipemare[l];
    optimizer.set_lr(plan_.lr_at(step) * fixes.lr_scale(step));
    fixes.before_step();
    optimizer.step();
    fixes.after_step();
  }

  // The squared norm of each stage's latest step, summed over this rank's stages.
  double grad_norm_squared() const {
    double sum = 0;
    for (const auto& [stage, squared] : latest_squared_) sum += squared;
    return sum;
  }
  // The most versions one stage held since the last call.
  int take_most_held() { return std::exchange(most_held_, 1); }
  // The most bytes of weights this rank's stages held since the last call: each stage's most
  // copies (versions, predictions, pipemare's delta and corrected copy) times its bytes.
  int64_t take_weight_bytes() {
    int64_t bytes = 0;
    for (size_t l = 0; l < model_.stages.size(); ++l) {
      const int copies = most_copies_.count(l) ? most_copies_.at(l) : 1;
      bytes += copies * parameter_bytes(model_.stages[l]);
    }
    most_copies_.clear();
    for (size_t l = 0; l < model_.stages.size(); ++l) note_held(l);  // what carries over
    return bytes;
  }

 private:
  const TrainingPlan& plan_;
  RankModel& model_;
  std::map<int, double> latest_squared_;
  std::map<int, int> pending_version_;  // stage -> version of its backwards since its last step
  int most_held_ = 1;
  std::map<size_t, int> most_copies_;  // [local stage] -> most weight copies since the last take

  // Records local stage l's copies now: versions and predictions (weight_versions), and beside
  // them pipemare's buffers (weight bytes).
  void note_held(size_t l) {
    const int versions =
        model_.versions[l].held() + (model_.predictions.empty() ? 0 : model_.predictions[l].held());
    most_held_ = std::max(most_held_, versions);
    const int copies = versions + (model_.pipemare.empty() ? 0 : model_.pipemare[l].buffers());
    int& most = most_copies_[l];
    most = std::max(most, copies);
  }
};

// A synchronous optimizer step with post-validation (the zero-bubble paper's section 4): no
// all-reduce before it. Pipeline rank r receives the sum of the squared gradient norms of ranks
// 0 .. r-1, adds its own and passes it on; it steps at once unless that partial sum already
// calls for clipping or is not finite (the sums only grow along the chain, so a partial sum that
// triggers means the full one does). The last rank sends the full sum back to every rank, which
// then takes its step back when the full norm calls for clipping (and steps again on the
// clipped gradients) or is not finite (and leaves the step to the caller). Returns the global
// norm; `rollbacks` is 1 when this rank took its step back.
double post_validated_step(const TrainingPlan& plan, int step, RankModel& model,
                           const std::vector<torch::Tensor>& counted, Transport& pipeline,
                           int& rollbacks) {
  const int rank = pipeline.rank(), last = pipeline.world_size() - 1;
  auto partial = torch::full({1}, squared_grad_norm(counted), torch::kFloat64);
  if (rank > 0) {
    auto before = torch::empty({1}, torch::kFloat64);
    pipeline.recv(before, rank - 1, tag_of(ControlTag::kPartialNorm)).wait();
    partial += before;
  }
  PendingComm passed;
  if (rank < last) passed = pipeline.send(partial, rank + 1, tag_of(ControlTag::kPartialNorm));
  const bool speculative = !clips_or_skips(std::sqrt(partial.item<double>()), plan.clip);
  for (auto& optimizer : model.optimizers) {
    optimizer.set_lr(plan.lr_at(step));
    if (speculative) optimizer.step_undoably(plan.exact_rollback);
  }
  auto full = partial;
  if (rank == last) {
    std::vector<PendingComm> sent;
    for (int r = 0; r < last; ++r) {
      sent.push_back(pipeline.send(full, r, tag_of(ControlTag::kFullNorm)));
    }
    for (auto& s : sent) s.wait();
  } else {
    full = torch::empty({1}, torch::kFloat64);
    pipeline.recv(full, last, tag_of(ControlTag::kFullNorm)).wait();
  }
  passed.wait();
  const double norm = std::sqrt(full.item<double>());
  rollbacks = 0;
  if (!clips_or_skips(norm, plan.clip)) return norm;
  if (speculative) {
    for (auto& optimizer : model.optimizers) optimizer.undo_step();
    rollbacks = 1;
  }
  if (!std::isfinite(norm)) return norm;
  scale_to_max_norm(model.params, norm, plan.clip);
  for (auto& optimizer : model.optimizers) optimizer.step();
  return norm;
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
  const int rank = transport.rank();  // in the world: D copies of the P-rank pipeline
  PPTRAIN_CHECK(transport.world_size() == plan.world_size(), "WORLD_SIZE=", transport.world_size(),
                " but the run is for --pp ", plan.ranks(), " x --dp ", plan.copies);
  check_ranks_agree(plan, transport);  // before any message whose shape the plan decides
  const int pipeline_rank = plan.pipeline_rank(rank);
  // Every rank makes the pipelines' groups, then the copies' groups: the groups each family
  // makes are disjoint, so no rank waits for one that is forming another group.
  const Group pipeline = make_group(transport, plan.pipeline_of(plan.copy_of(rank)));
  const Group copies = make_group(transport, plan.copies_of(pipeline_rank));
  RankModel model(plan, rank);
  const RankData data(plan, rank);
  // Which stages combine gradients with which ranks: with --dp all of this rank's with its
  // copies (a mean); in a replicated schedule each replicated stage with its replicas (a sum).
  // Each group of replicas is made once, every rank going through the stages in order.
  const Schedule& schedule = *plan.schedule;
  std::map<std::vector<int>, Group> replica_groups;
  for (int s = 0; s < schedule.num_stages && plan.copies == 1; ++s) {
    const std::vector<int> members = schedule.replicas_of(s);
    if (members.size() > 1 && model.local.count(s) && !replica_groups.count(members)) {
      replica_groups.emplace(members, make_group(*pipeline, members));
    }
  }
  std::vector<StageGroup> combined;
  std::vector<torch::Tensor> counted;  // parameters whose gradient norm this rank adds
  std::vector<const Stage*> saved;     // stages whose layers this rank writes to a checkpoint
  std::vector<const StageOptimizer*> saved_state;
  for (size_t l = 0; l < model.stages.size(); ++l) {
    const Stage& stage = model.stages[l];
    const std::vector<int> members = schedule.replicas_of(stage.index());
    const bool first_replica = members.front() == pipeline_rank;  // of a replicated stage
    if (plan.copies > 1) {
      combined.push_back({&stage, copies.view, plan.copies});
    } else if (members.size() > 1) {
      combined.push_back({&stage, replica_groups.at(members).view, 1});
    }
    if (first_replica) {
      const auto stage_params = stage.parameters();
      counted.insert(counted.end(), stage_params.begin(), stage_params.end());
    }
    // The first copy of the pipeline writes the checkpoints (the others hold the same weights,
    // and unless --zero 1 gave each copy its own layers' state, the same optimizer state).
    if (first_replica && plan.copy_of(rank) == 0) saved.push_back(&stage);
    if (first_replica && (plan.copy_of(rank) == 0 || plan.zero == 1)) {
      saved_state.push_back(&model.optimizers[l]);
    }
  }
  StageCopies stage_copies(combined);
  if (plan.average_every > 0) stage_copies.keep_centre();  // avgpipe: the copies' common start
  const RankCheckpoint to_save{saved, saved_state};
  const ModelOptions model_options = plan.model;
  ExecutorOptions executor_options;
  executor_options.rank = pipeline_rank;
  executor_options.stages = model.stage_pointers();
  executor_options.transport = pipeline.view;
  executor_options.loss = [model_options](const torch::Tensor& output,
                                          const torch::Tensor& target) {
    return compute_loss(model_options, output, target);
  };
  executor_options.boundary_shapes = plan.boundary_shapes;
  // A backward on other weights than its forward's rebuilds the graph on them.
  executor_options.recompute = plan.recompute || plan.weights.backward_reruns_forward();
  executor_options.microbatches_per_step = plan.microbatches();
  if (plan.autograd_weight_split) {
    executor_options.weight_split = ExecutorOptions::WeightSplit::kAutograd;
  }
  executor_options.reduce_gradients = [&stage_copies](int stage) {
    stage_copies.start_average(stage);
  };
  AsyncUpdates async(plan, model);
  // A synchronous rank holds its live weights, and avgpipe's centre beside them, all run long.
  int64_t synchronous_weight_bytes = 0;
  for (const Stage& stage : model.stages) {
    synchronous_weight_bytes += (plan.average_every > 0 ? 2 : 1) * parameter_bytes(stage);
  }
  if (plan.asynchronous()) {
    executor_options.weights = [&async](int stage, int mb, bool backward) -> Stage& {
      return async.weights(stage, mb, backward);
    };
    executor_options.after_backward = [&async](int stage, int mb) {
      async.after_backward(stage, mb);
    };
  }
  Executor executor(plan.schedule, executor_options);
  const bool reports = rank == 0;  // rank 0 gets the step reports
  const RunInfo run = run_info(plan);
  if (reports) {
    for (StepObserver* o : observers) o->on_start(run);
  }

  // An asynchronous pipeline never waits for the other ranks between steps: no barrier after
  // the first, and its step reports are sent without waiting (they are waited on a step later).
  std::vector<PendingComm> unsent_reports, older_reports;
  transport.barrier();  // a common start, so the ranks' timelines line up
  auto start = Clock::now();
  for (int step = plan.first_step; step < plan.steps; ++step) {
    maybe_crash_for_test(rank, step);
    const StepData batch = data.step(step, plan.asynchronous(), plan.steps);
    if (!plan.asynchronous()) {
      for (auto& p : model.params) p.mutable_grad().zero_();
      if (step > 0) transport.barrier();
      start = Clock::now();
    }
    const int64_t base_bytes = allocated_bytes();
    reset_peak();
    StepRecord record = executor.run_step(batch, start);
    RankStep mine;
    mine.peak_activation_bytes = peak_bytes() - base_bytes;
    double grad_norm = 0;
    if (!plan.asynchronous()) {
      // A reduction's event ends when its sum is known to be back (it only started it).
      // avgpipe's copies keep their own gradients.
      const auto reduced = plan.average_every > 0
                               ? std::map<int, std::chrono::steady_clock::time_point>{}
                               : stage_copies.finish_average();
      for (TimelineEvent& e : record.events) {
        if (e.action.op == Op::REDUCE_GRAD && reduced.count(e.action.stage)) {
          e.end = std::chrono::duration<double>(reduced.at(e.action.stage) - start).count();
        }
      }
      // The copies now hold the same gradients: the norm is the one pipeline's (avgpipe: each
      // copy's own).
      if (plan.post_validation) {
        grad_norm = post_validated_step(plan, step, model, counted, *pipeline, mine.rollbacks);
      } else {
        grad_norm = clip_grad_norm(model.params, plan.clip, pipeline.view, &counted);
      }
      // Every rank of a pipeline has the same norm (and with averaged gradients every copy), so
      // they take the same branch.
      // (post_validated_step() has stepped already, or taken the step back when the norm is not
      // finite.)
      if (!std::isfinite(grad_norm)) {
        if (!plan.skip_nonfinite) {
          throw std::runtime_error(nonfinite_message(plan, step, grad_norm, record));
        }
      } else if (!plan.post_validation) {
        for (auto& optimizer : model.optimizers) {
          optimizer.set_lr(plan.lr_at(step));
          optimizer.step();
        }
        // --zero 1: each copy stepped its own layers; the others get their new weights.
        if (plan.zero == 1) stage_copies.share_weights(model.owner, plan.copy_of(rank));
      }
      // avgpipe: every copy, whichever branch its own norm took, joins the pull.
      if (plan.average_every > 0 && (step + 1) % plan.average_every == 0) {
        stage_copies.pull_to_centre(plan.average_alpha);
      }
    } else {
      mine.grad_norm_squared = async.grad_norm_squared();
      mine.weight_versions = async.take_most_held();
      mine.weight_bytes = async.take_weight_bytes();
    }
    if (!plan.asynchronous()) mine.weight_bytes = synchronous_weight_bytes;
    mine.bytes_sent = record.bytes_sent + stage_copies.take_bytes_sent();
    mine.compute_s = record.compute_cpu_s;
    mine.seconds = seconds_since(start);
    for (const auto& optimizer : model.optimizers) {
      mine.optimizer_state_bytes += optimizer.state_bytes();
    }
    mine.start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
    mine.has_loss = record.has_loss;
    mine.loss = record.loss;
    mine.events = std::move(record.events);
    const auto report = gather_step_report(run, step, grad_norm, mine, transport,
                                           plan.asynchronous() ? &unsent_reports : nullptr);
    if (report) {
      for (StepObserver* o : observers) o->on_step(*report);
    }
    for (auto& sent : older_reports) sent.wait();
    older_reports = std::move(unsent_reports);
    unsent_reports.clear();
    if (plan.asynchronous()) start = Clock::now();  // the next segment starts here
    if (plan.save_every > 0 && (step + 1) % plan.save_every == 0 && step + 1 < plan.steps) {
      save_checkpoint(plan, to_save, step + 1, transport);
    }
  }
  for (auto& sent : older_reports) sent.wait();

  if (!plan.save_dir.empty()) save_checkpoint(plan, to_save, plan.steps, transport);
  transport.barrier();
  if (reports) {
    for (StepObserver* o : observers) o->on_end(run);
  }
}

}  // namespace pptrain
