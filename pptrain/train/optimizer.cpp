#include "pptrain/train/optimizer.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"

namespace pptrain {
namespace {

// The key under which a torch optimizer keeps a parameter's state: its TensorImpl's address.
void* state_key(const torch::Tensor& p) {
  return p.unsafeGetTensorImpl();
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(
    const OptimizerOptions& options, const std::vector<torch::Tensor>& params) {
  if (params.empty()) return nullptr;
  if (options.kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(options.lr).weight_decay(0.01));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(options.lr).momentum(options.momentum));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

std::string optimizer_file(const std::string& dir, int layer) {
  return (std::filesystem::path(dir) / ("optim_" + std::to_string(layer) + ".pt")).string();
}

StageOptimizer::StageOptimizer(const OptimizerOptions& options, const Stage& stage,
                               const std::function<bool(int layer)>& keeps)
    : first_layer_(stage.first_layer()) {
  for (int i = 0; i < stage.num_layers(); ++i) {
    const bool kept = !keeps || keeps(first_layer_ + i);
    layers_.push_back(kept ? make_torch_optimizer(options, stage.layer_parameters(i)) : nullptr);
  }
}

int64_t StageOptimizer::kept_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& optimizer : layers_) {
    if (!optimizer) continue;
    for (const auto& group : optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) bytes += tensor_bytes(p);
    }
  }
  return bytes;
}

int64_t StageOptimizer::state_bytes() const {
  int64_t bytes = 0;
  const auto add = [&bytes](const torch::Tensor& t) { bytes += tensor_bytes(t); };
  for (const auto& optimizer : layers_) {
    if (!optimizer) continue;
    for (const auto& [key, state] : optimizer->state()) {
      if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
        add(adamw->exp_avg());
        add(adamw->exp_avg_sq());
        add(adamw->max_exp_avg_sq());
      } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
        add(sgd->momentum_buffer());
      }
    }
  }
  return bytes;
}

std::vector<torch::Tensor> StageOptimizer::direction(const Stage& stage) const {
  PPTRAIN_ASSERT(stage.first_layer() == first_layer_ &&
                 stage.num_layers() == static_cast<int>(layers_.size()));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (const auto& p : stage.layer_parameters(static_cast<int>(i))) {
      out.push_back(torch::zeros_like(p));
      if (!layers_[i]) continue;
      const auto& state = layers_[i]->state();
      const auto found = state.find(state_key(p));
      if (found == state.end()) continue;
      const auto& group = layers_[i]->param_groups().front();
      if (const auto* adamw =
              dynamic_cast<const torch::optim::AdamWParamState*>(found->second.get())) {
        const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
        const double steps = static_cast<double>(adamw->step());
        const double m_scale = 1 / (1 - std::pow(std::get<0>(o.betas()), steps));
        const double v_scale = 1 / (1 - std::pow(std::get<1>(o.betas()), steps));
        out.back() =
            (adamw->exp_avg() * m_scale) / ((adamw->exp_avg_sq() * v_scale).sqrt() + o.eps());
        out.back().add_(p, o.weight_decay());
      } else if (const auto* sgd =
                     dynamic_cast<const torch::optim::SGDParamState*>(found->second.get())) {
        if (sgd->momentum_buffer().defined()) out.back() = sgd->momentum_buffer().clone();
      }
    }
  }
  return out;
}

void StageOptimizer::set_lr(double lr) {
  for (auto& optimizer : layers_) {
    if (optimizer) set_learning_rate(*optimizer, lr);
  }
}

void StageOptimizer::step() {
  for (auto& optimizer : layers_) {
    if (optimizer) optimizer->step();
  }
}

namespace {

// The state tensors of one parameter (AdamW: the two moments; SGD: the momentum buffer).
std::vector<torch::Tensor> state_tensors(torch::optim::OptimizerParamState& state) {
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    return {adamw->exp_avg(), adamw->exp_avg_sq()};
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    return {sgd->momentum_buffer()};
  }
  PPTRAIN_UNREACHABLE("an optimizer state of an unknown kind");
  return {};
}

// A copy of one parameter's state whose tensors are copies too (OptimizerParamState::clone()
// shares them).
std::unique_ptr<torch::optim::OptimizerParamState> deep_copy(
    const torch::optim::OptimizerParamState& state) {
  const auto copied = [](const torch::Tensor& t) { return t.defined() ? t.clone() : t; };
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    auto out = std::make_unique<torch::optim::AdamWParamState>(*adamw);
    out->exp_avg(copied(adamw->exp_avg()));
    out->exp_avg_sq(copied(adamw->exp_avg_sq()));
    out->max_exp_avg_sq(copied(adamw->max_exp_avg_sq()));
    return out;
  }
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    auto out = std::make_unique<torch::optim::SGDParamState>(*sgd);
    out->momentum_buffer(copied(sgd->momentum_buffer()));
    return out;
  }
  PPTRAIN_UNREACHABLE("an optimizer state of an unknown kind");
  return nullptr;
}

// Calls `visit(optimizer, parameter, index)` for every parameter of every kept layer, in order.
template <typename Visit>
void for_each_parameter(std::vector<std::unique_ptr<torch::optim::Optimizer>>& layers,
                        Visit visit) {
  size_t index = 0;
  for (auto& optimizer : layers) {
    if (!optimizer) continue;
    for (auto& p : optimizer->param_groups().front().params()) visit(*optimizer, p, index++);
  }
}

// Undoes the last AdamW step of `p` from its gradient and state (Algorithm 1 of the
// zero-bubble paper): the update with the moments after the step, the decay, then the moments.
void undo_adamw(torch::optim::AdamWParamState& state, const torch::optim::AdamWOptions& o,
                torch::Tensor& p) {
  const auto [beta1, beta2] = o.betas();
  const double t = static_cast<double>(state.step());
  const double bias1 = 1 - std::pow(beta1, t), bias2 = 1 - std::pow(beta2, t);
  const torch::Tensor& g = p.grad();
  auto denom = (state.exp_avg_sq().sqrt() / std::sqrt(bias2)).add_(o.eps());
  p.addcdiv_(state.exp_avg(), denom, o.lr() / bias1);
  if (o.weight_decay() != 0) p.div_(1 - o.lr() * o.weight_decay());
  state.exp_avg().sub_(g, 1 - beta1).div_(beta1);
  state.exp_avg_sq().addcmul_(g, g, -(1 - beta2)).div_(beta2);
  state.step(state.step() - 1);
}

// Undoes the last SGD step (no dampening, Nesterov or weight decay, as make_torch_optimizer makes
// it).
void undo_sgd(torch::optim::SGDParamState* state, const torch::optim::SGDOptions& o,
              torch::Tensor& p) {
  if (!state) {  // no momentum: p -= lr g
    p.add_(p.grad(), o.lr());
    return;
  }
  p.add_(state->momentum_buffer(), o.lr());
  state->momentum_buffer().sub_(p.grad()).div_(o.momentum());
}

}  // namespace

void StageOptimizer::step_undoably(bool exact) {
  torch::NoGradGuard no_grad;
  Undo undo;
  undo.exact = exact;
  for_each_parameter(layers_, [&](torch::optim::Optimizer& optimizer, torch::Tensor& p, size_t) {
    auto& state = optimizer.state();
    const auto found = state.find(state_key(p));
    undo.had_state.push_back(found != state.end());
    if (!exact) return;
    undo.params.push_back(p.detach().clone());
    undo.states.emplace_back();
    undo.steps.push_back(0);
    if (found == state.end()) return;
    for (const auto& t : state_tensors(*found->second)) {
      undo.states.back().push_back(t.defined() ? t.clone() : t);
    }
    if (const auto* adamw =
            dynamic_cast<const torch::optim::AdamWParamState*>(found->second.get())) {
      undo.steps.back() = adamw->step();
    }
  });
  step();
  undo_ = std::move(undo);
}

void StageOptimizer::undo_step() {
  PPTRAIN_ASSERT(undo_, "undo_step() without a step_undoably() before it");
  torch::NoGradGuard no_grad;
  const Undo& undo = *undo_;
  for_each_parameter(layers_, [&](torch::optim::Optimizer& optimizer, torch::Tensor& p, size_t i) {
    auto& state = optimizer.state();
    const auto key = state_key(p);
    const auto found = state.find(key);
    auto& group = optimizer.param_groups().front();
    if (undo.exact) {
      p.copy_(undo.params[i]);
    } else if (auto* adamw = found == state.end() ? nullptr
                                                  : dynamic_cast<torch::optim::AdamWParamState*>(
                                                        found->second.get())) {
      undo_adamw(*adamw, static_cast<const torch::optim::AdamWOptions&>(group.options()), p);
    } else {
      undo_sgd(found == state.end()
                   ? nullptr
                   : dynamic_cast<torch::optim::SGDParamState*>(found->second.get()),
               static_cast<const torch::optim::SGDOptions&>(group.options()), p);
    }
    if (!undo.had_state[i]) {  // the step made the state: the undone step has none
      if (found != state.end()) state.erase(found);
      return;
    }
    if (!undo.exact) return;
    auto tensors = state_tensors(*found->second);
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (tensors[k].defined()) tensors[k].copy_(undo.states[i][k]);
    }
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
      adamw->step(undo.steps[i]);
    }
  });
  undo_.reset();
}

std::vector<ArchiveFile> StageOptimizer::archives(bool copy) const {
  std::vector<ArchiveFile> files;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    ArchiveFile file(optimizer_file("", first_layer_ + static_cast<int>(i)));
    // While the archive is made, the states stored elsewhere step out of the map, and with
    // `copy` the others are swapped for copies (the archive keeps the tensors it is given).
    auto& state = layers_[i]->state();
    using Key = std::decay_t<decltype(state)>::key_type;
    std::vector<std::pair<Key, std::unique_ptr<torch::optim::OptimizerParamState>>> aside;
    for (const auto& p : elsewhere_) {
      const auto found = state.find(state_key(p));
      if (found == state.end()) continue;
      aside.emplace_back(found->first, std::move(found->second));
      state.erase(found);
    }
    if (copy) {
      for (auto& [key, value] : state) {
        std::unique_ptr<torch::optim::OptimizerParamState> copied = deep_copy(*value);
        for (const torch::Tensor& t : state_tensors(*copied)) file.copies.push_back(t);
        aside.emplace_back(key, std::exchange(value, std::move(copied)));
      }
    }
    const auto restore = [&] {
      for (size_t k = 0; k < aside.size(); ++k) {
        state[aside[k].first] = std::move(aside[k].second);
      }
    };
    try {
      layers_[i]->save(*file.archive);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    files.push_back(std::move(file));
  }
  return files;
}

void StageOptimizer::save(const std::string& dir) const {
  for (const ArchiveFile& file : archives(/*copy=*/false)) write_archive_file(file, dir);
}

torch::optim::Optimizer* StageOptimizer::optimizer_of(const torch::Tensor& parameter) const {
  for (const auto& optimizer : layers_) {
    if (!optimizer) continue;
    for (const auto& p : optimizer->param_groups().front().params()) {
      if (p.is_same(parameter)) return optimizer.get();
    }
  }
  return nullptr;
}

std::vector<torch::Tensor> StageOptimizer::state_of(const torch::Tensor& parameter) const {
  torch::optim::Optimizer* optimizer = optimizer_of(parameter);
  if (!optimizer) return {};
  auto& state = optimizer->state();
  const auto found = state.find(state_key(parameter));
  if (found == state.end()) return {};
  std::vector<torch::Tensor> out = state_tensors(*found->second);
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(found->second.get())) {
    out.push_back(torch::full({1}, static_cast<double>(adamw->step()), torch::kFloat64));
  }
  return out;
}

std::vector<torch::Tensor> StageOptimizer::state_like(const torch::Tensor& parameter) const {
  torch::optim::Optimizer* optimizer = optimizer_of(parameter);
  if (!optimizer) return {};
  const auto zeros = torch::zeros_like(parameter, at::MemoryFormat::Contiguous);
  if (dynamic_cast<torch::optim::AdamW*>(optimizer)) {
    return {zeros, zeros.clone(), torch::zeros({1}, torch::kFloat64)};
  }
  return {zeros};
}

void StageOptimizer::set_state(const torch::Tensor& parameter,
                               const std::vector<torch::Tensor>& values) {
  torch::optim::Optimizer* optimizer = optimizer_of(parameter);
  PPTRAIN_ASSERT(optimizer && values.size() == state_like(parameter).size(),
                 "a state of the optimizer's kind for one of its parameters");
  auto& state = optimizer->state();
  const auto key = state_key(parameter);
  if (dynamic_cast<torch::optim::AdamW*>(optimizer)) {
    auto made = std::make_unique<torch::optim::AdamWParamState>();
    made->exp_avg(values[0].clone());
    made->exp_avg_sq(values[1].clone());
    made->step(static_cast<int64_t>(values[2].item<double>()));
    state[key] = std::move(made);
  } else {
    auto made = std::make_unique<torch::optim::SGDParamState>();
    made->momentum_buffer(values[0].clone());
    state[key] = std::move(made);
  }
}

void StageOptimizer::load(const std::string& dir) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    const std::string path = optimizer_file(dir, first_layer_ + static_cast<int>(i));
    PPTRAIN_CHECK(std::filesystem::is_regular_file(path), "--resume: missing optimizer file '",
                  path, "'");
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      layers_[i]->load(archive);
    } catch (const c10::Error& e) {
      PPTRAIN_CHECK(false, "--resume: cannot read '", path, "' into the optimizer of layer ",
                    first_layer_ + i, ": ", e.what_without_backtrace());
    }
  }
}

}  // namespace pptrain
