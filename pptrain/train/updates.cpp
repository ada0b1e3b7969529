#include "pptrain/train/updates.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"
#include "pptrain/train/control_tags.h"

namespace pptrain {
namespace {

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

}  // namespace

RankWeights::RankWeights(std::vector<Stage*> stages_in,
                         const std::vector<std::function<Stage()>>& make_copy,
                         const VersionRule& rule, const OptimizerOptions& optimizer,
                         const FamilyValues& family, const std::function<bool(int layer)>& keeps,
                         bool serial)
    : stages(std::move(stages_in)) {
  PPTRAIN_ASSERT(make_copy.size() == stages.size(), "a copy factory per stage");
  for (size_t l = 0; l < stages.size(); ++l) {
    Stage& stage = *stages[l];
    const int s = stage.index();
    local[s] = static_cast<int>(l);
    auto stage_params = stage.parameters();
    for (auto& p : stage_params) p.mutable_grad() = torch::zeros_like(p);
    params.insert(params.end(), stage_params.begin(), stage_params.end());
    optimizers.emplace_back(optimizer, stage, keeps);
    // A predicting rule's extra copies are predictions (its hooks), not stashed versions: its
    // pipeline computes on the live weights.
    const bool stashes = !rule.predicts() && rule.versions_kept(s) > 1;
    versions.emplace_back(&stage, make_copy[l], /*snapshots=*/serial || stashes);
    hooks.push_back(make_stage_hooks(rule, &stage, make_copy[l], family));
  }
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      Transport* transport, const std::vector<torch::Tensor>* counted) {
  auto squared = torch::full({1}, squared_grad_norm(counted ? *counted : params), torch::kFloat64);
  if (transport) transport->allreduce_sum(squared);
  const double norm = std::sqrt(squared.item<double>());
  scale_to_max_norm(params, norm, max_norm);
  return norm;
}

double post_validated_step(const OptimizerOptions& optimizer, int step, RankWeights& model,
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
  const bool speculative = !clips_or_skips(std::sqrt(partial.item<double>()), optimizer.clip);
  for (auto& stage_optimizer : model.optimizers) {
    stage_optimizer.set_lr(optimizer.lr_at(step));
    if (speculative) stage_optimizer.step_undoably(optimizer.exact_rollback);
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
  if (!clips_or_skips(norm, optimizer.clip)) return norm;
  if (speculative) {
    for (auto& stage_optimizer : model.optimizers) stage_optimizer.undo_step();
    rollbacks = 1;
  }
  if (!std::isfinite(norm)) return norm;
  scale_to_max_norm(model.params, norm, optimizer.clip);
  for (auto& stage_optimizer : model.optimizers) stage_optimizer.step();
  return norm;
}

AsyncUpdates::AsyncUpdates(const VersionRule& rule, const OptimizerOptions& optimizer,
                           RankWeights& weights, TiedParameters* tied)
    : rule_(rule), optimizer_(optimizer), model_(weights), tied_(tied) {
  if (!tied_ || tied_->empty()) return;
  // Update u of a stage follows its backward of microbatch (u + 1) x period - 1. The first
  // stage of a 1F1B order runs the forward of microbatch i + S after its backward of i, so the
  // last stage's update u + ceil(S / period) comes after the first stage's update u: the lag at
  // which the other copies never wait for it.
  const int period = rule_.period();
  const int lag = (rule_.stages + period - 1) / period;
  tied_->use_asynchronously(optimizer_, lag, [this, period](int update) {
    return optimizer_.lr_at(((update + 1) * period - 1) / rule_.microbatches_per_step);
  });
}

void AsyncUpdates::finish(int steps) {
  if (!tied_ || tied_->empty() || steps <= 0) return;
  const int updates = steps * rule_.microbatches_per_step / rule_.period();
  tied_->finish_async(updates - 1);
}

Stage& AsyncUpdates::weights(int stage, int mb, bool backward) {
  const int version =
      backward ? rule_.backward_version(mb, stage) : rule_.forward_version(mb, stage);
  const int l = model_.local.at(stage);
  StageVersions& versions = model_.versions[l];
  Stage& weights = model_.hooks[l] ? model_.hooks[l]->weights(mb, backward, versions)
                                   : versions.weights(version);
  note_held(l);
  return weights;
}

void AsyncUpdates::after_backward(int stage, int mb) {
  const int l = model_.local.at(stage);
  StageVersions& versions = model_.versions[l];
  const int version = rule_.backward_version(mb, stage);
  if (model_.hooks[l]) model_.hooks[l]->gradients_to(versions.weights(version));
  auto [pending, fresh] = pending_version_.emplace(stage, version);
  PPTRAIN_ASSERT(fresh || pending->second == version, "stage ", stage,
                 " summed gradients of versions ", pending->second, " and ", version);
  if (!rule_.steps_after(mb)) return;
  pending_version_.erase(stage);
  versions.gradients_to_live(version);
  const int oldest = rule_.oldest_needed_after(mb, stage);
  if (versions.live_version() >= oldest) versions.weights(versions.live_version());
  note_held(l);
  versions.release_older_than(oldest);
  const auto params = model_.stages[l]->parameters();
  const int update = mb / rule_.period();
  if (tied_) tied_->before_async_step(stage, update);
  const double norm = clip_grad_norm(params, optimizer_.clip, nullptr);  // this stage's own
  latest_squared_[stage] = norm * norm;
  const bool finite = std::isfinite(norm);
  if (finite) {
    step(l, mb / rule_.microbatches_per_step);
  } else if (!optimizer_.skip_nonfinite) {
    throw std::runtime_error("step " + std::to_string(mb / rule_.microbatches_per_step + 1) +
                             ": the gradient norm of stage " + std::to_string(stage) + " is " +
                             std::to_string(norm) + " after microbatch " + std::to_string(mb) +
                             "; stopped before its optimizer step (a smaller --lr may help; "
                             "--skip-nonfinite skips such steps instead)");
  }
  if (tied_) tied_->after_async_step(stage, update, finite);
  for (auto& p : params) p.mutable_grad().zero_();
  versions.stepped();
  note_held(l);
  if (model_.hooks[l]) {
    model_.hooks[l]->after_update({finite, model_.optimizers[l], *model_.stages[l],
                                   versions.live_version(),
                                   optimizer_.lr_at(mb / rule_.microbatches_per_step), oldest});
  }
}

void AsyncUpdates::step(int l, int step) {
  StageOptimizer& optimizer = model_.optimizers[l];
  StageHooks* hooks = model_.hooks[l].get();
  if (!hooks) {
    optimizer.set_lr(optimizer_.lr_at(step));
    optimizer.step();
    return;
  }
  optimizer.set_lr(optimizer_.lr_at(step) * hooks->lr_scale(step));
  hooks->before_step();
  optimizer.step();
}

double AsyncUpdates::grad_norm_squared() const {
  double sum = 0;
  for (const auto& [stage, squared] : latest_squared_) sum += squared;
  return sum;
}

int64_t AsyncUpdates::take_weight_bytes() {
  int64_t bytes = 0;
  for (size_t l = 0; l < model_.stages.size(); ++l) {
    const int copies = most_copies_.count(l) ? most_copies_.at(l) : 1;
    bytes += copies * parameter_bytes(*model_.stages[l]);
  }
  most_copies_.clear();
  for (size_t l = 0; l < model_.stages.size(); ++l) note_held(l);  // what carries over
  return bytes;
}

void AsyncUpdates::note_held(size_t l) {
  const StageHooks* hooks = model_.hooks[l].get();
  const int versions = model_.versions[l].held() + (hooks ? hooks->versions_held() : 0);
  most_held_ = std::max(most_held_, versions);
  const int copies = versions + (hooks ? hooks->buffers() : 0);
  int& most = most_copies_[l];
  most = std::max(most, copies);
}

void AsyncUpdates::save_state(NamedTensors& out) const {
  for (size_t l = 0; l < model_.stages.size(); ++l) {
    const int s = model_.stages[l]->index();
    const std::string prefix = "stage/" + std::to_string(s) + "/";
    model_.versions[l].save_state(prefix, out);
    if (model_.hooks[l]) model_.hooks[l]->save_state(prefix, out);
    if (pending_version_.count(s)) {
      out[prefix + "pending_version"] = number_tensor(pending_version_.at(s));
    }
    if (latest_squared_.count(s)) {
      out[prefix + "latest_squared_norm"] = torch::tensor({latest_squared_.at(s)}, torch::kFloat64);
    }
  }
}

void AsyncUpdates::load_state(const NamedTensors& in, const std::string& flag) {
  for (size_t l = 0; l < model_.stages.size(); ++l) {
    const int s = model_.stages[l]->index();
    const std::string prefix = "stage/" + std::to_string(s) + "/";
    model_.versions[l].load_state(prefix, in, flag);
    if (model_.hooks[l]) model_.hooks[l]->load_state(prefix, in, flag);
    pending_version_.erase(s);
    if (in.count(prefix + "pending_version")) {
      pending_version_[s] = static_cast<int>(number_of(in, prefix + "pending_version", flag));
    }
    latest_squared_.erase(s);
    if (in.count(prefix + "latest_squared_norm")) {
      latest_squared_[s] = in.at(prefix + "latest_squared_norm").item<double>();
    }
  }
}

int64_t parameter_bytes(const Stage& stage) {
  int64_t bytes = 0;
  for (const auto& p : stage.parameters()) bytes += tensor_bytes(p);
  return bytes;
}

}  // namespace pptrain
