#include "pptrain/train/optimizer.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <type_traits>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"

namespace pptrain {
namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainingPlan& plan,
                                                        const std::vector<torch::Tensor>& params) {
  if (params.empty()) return nullptr;
  if (plan.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(plan.lr).weight_decay(0.01));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(plan.lr).momentum(plan.momentum));
}

// The key under which a torch optimizer keeps a parameter's state: its TensorImpl's address,
// as a string in LibTorch 1.13 and 2.x's releases so far, as the pointer should a release change
// the map's key type.
template <typename StateMap>
typename StateMap::key_type state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    return c10::guts::to_string(p.unsafeGetTensorImpl());
  } else {
    return static_cast<typename StateMap::key_type>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

std::string optimizer_file(const std::string& dir, int layer) {
  return (std::filesystem::path(dir) / ("optim_" + std::to_string(layer) + ".pt")).string();
}

StageOptimizer::StageOptimizer(const TrainingPlan& plan, const Stage& stage,
                               const std::function<bool(int layer)>& keeps)
    : first_layer_(stage.first_layer()) {
  for (int i = 0; i < stage.num_layers(); ++i) {
    const bool kept = !keeps || keeps(first_layer_ + i);
    layers_.push_back(kept ? make_optimizer(plan, stage.layer_parameters(i)) : nullptr);
  }
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
      const auto found = state.find(state_key<std::decay_t<decltype(state)>>(p));
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
    if (!optimizer) continue;
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
  }
}

void StageOptimizer::step() {
  for (auto& optimizer : layers_) {
    if (optimizer) optimizer->step();
  }
}

void StageOptimizer::save(const std::string& dir) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    const std::string path = optimizer_file(dir, first_layer_ + static_cast<int>(i));
    try {
      torch::serialize::OutputArchive archive;
      layers_[i]->save(archive);
      archive.save_to(path);
    } catch (const c10::Error& e) {
      PPTRAIN_CHECK(false, "cannot write '", path, "': ", e.what_without_backtrace());
    }
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
