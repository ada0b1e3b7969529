#include "pptrain/train/weight_prediction.h"

#include "pptrain/common/check.h"
#include "pptrain/train/stage_hooks.h"

namespace pptrain {

Stage& ShiftedWeights::shift(const Stage& base, const std::vector<torch::Tensor>& direction,
                             double scale) {
  if (!copy_) copy_.emplace(make_copy_());
  torch::NoGradGuard no_grad;
  const auto from = base.parameters();
  auto to = copy_->parameters();
  PPTRAIN_ASSERT(from.size() == to.size() && (direction.empty() || direction.size() == to.size()));
  for (size_t p = 0; p < to.size(); ++p) {
    if (direction.empty()) {
      to[p].copy_(from[p]);
    } else {
      torch::sub_out(to[p], from[p], direction[p], scale);
    }
  }
  return *copy_;
}

void ShiftedWeights::save_state(const std::string& prefix, NamedTensors& out) const {
  if (copy_) put_weights(prefix, *copy_, out);
}

void ShiftedWeights::load_state(const std::string& prefix, const NamedTensors& in,
                                const std::string& flag) {
  if (!in.count(prefix + "param/count")) return;
  if (!copy_) copy_.emplace(make_copy_());
  take_weights(prefix, in, *copy_, flag);
}

void ShiftedWeights::gradients_to(Stage& target) {
  PPTRAIN_ASSERT(copy_.has_value());
  torch::NoGradGuard no_grad;
  const auto from = copy_->parameters();
  const auto to = target.parameters();
  for (size_t p = 0; p < from.size(); ++p) {
    if (!from[p].grad().defined()) continue;
    if (to[p].grad().defined()) {
      to[p].mutable_grad().add_(from[p].grad());
    } else {
      to[p].mutable_grad() = from[p].grad().clone();
    }
    from[p].mutable_grad().zero_();
  }
}

WeightPrediction::WeightPrediction(const VersionRule& rule, int stage,
                                   const std::function<Stage()>& make_copy)
    : rule_(rule), stage_(stage) {
  PPTRAIN_ASSERT(rule.predicts());
  slots_.emplace_back(make_copy);
  if (rule.prediction_group() > 1) slots_.emplace_back(make_copy);
}

Stage& WeightPrediction::weights(int mb, bool backward, StageVersions& versions) {
  PPTRAIN_ASSERT(pending_ == nullptr, "stage ", stage_,
                 ": a predicted backward's gradients were not collected");
  const int lag = rule_.prediction_lag(stage_, backward);
  const int version =
      backward ? rule_.backward_version(mb, stage_) : rule_.forward_version(mb, stage_);
  if (lag == 0) return versions.weights(version);
  Slot& slot = slots_[backward && slots_.size() > 1 ? 1 : 0];
  const std::pair<int, bool> key{mb / rule_.prediction_group(), backward};
  if (slot.key != key || !slot.copy.made()) {
    static const Direction kNone;  // version 0: no step yet, nothing to extrapolate
    const auto found = directions_.find(version);
    PPTRAIN_ASSERT(version == 0 || found != directions_.end(), "stage ", stage_,
                   ": no direction recorded for version ", version);
    const Direction& d = found == directions_.end() ? kNone : found->second;
    slot.copy.shift(versions.weights(version), d.tensors, lag * d.lr);
    slot.key = key;
  }
  Stage& predicted = slot.copy.stage();
  if (backward) pending_ = &slot.copy;
  return predicted;
}

void WeightPrediction::gradients_to(Stage& target) {
  if (pending_ == nullptr) return;
  pending_->gradients_to(target);
  pending_ = nullptr;
}

void WeightPrediction::record(int version, std::vector<torch::Tensor> direction, double lr) {
  directions_[version] = Direction{std::move(direction), lr};
}

void WeightPrediction::release_older_than(int version) {
  directions_.erase(directions_.begin(), directions_.lower_bound(version));
}

int WeightPrediction::held() const {
  int made = 0;
  for (const Slot& slot : slots_) made += slot.copy.made() ? 1 : 0;
  return made;
}

void WeightPrediction::save_state(const std::string& prefix, NamedTensors& out) const {
  PPTRAIN_ASSERT(pending_ == nullptr, "stage ", stage_, ": a checkpoint inside a backward");
  for (const auto& [version, direction] : directions_) {
    const std::string at = prefix + "direction/" + std::to_string(version) + "/";
    put_tensors(at, direction.tensors, out);
    out[at + "lr"] = torch::tensor({direction.lr}, torch::kFloat64);
  }
  std::vector<torch::Tensor> versions;
  for (const auto& [version, direction] : directions_) versions.push_back(number_tensor(version));
  put_tensors(prefix + "directions/", versions, out);
  for (size_t j = 0; j < slots_.size(); ++j) {
    const std::string at = prefix + "prediction/" + std::to_string(j) + "/";
    out[at + "group"] = number_tensor(slots_[j].key.first);
    out[at + "backward"] = number_tensor(slots_[j].key.second ? 1 : 0);
    slots_[j].copy.save_state(at, out);
  }
}

void WeightPrediction::load_state(const std::string& prefix, const NamedTensors& in,
                                  const std::string& flag) {
  directions_.clear();
  for (const torch::Tensor& number : take_tensors(prefix + "directions/", in, flag)) {
    const int version = static_cast<int>(number.item<int64_t>());
    const std::string at = prefix + "direction/" + std::to_string(version) + "/";
    directions_[version] =
        Direction{take_tensors(at, in, flag), tensor_named(in, at + "lr", flag).item<double>()};
  }
  for (size_t j = 0; j < slots_.size(); ++j) {
    const std::string at = prefix + "prediction/" + std::to_string(j) + "/";
    slots_[j].key = {static_cast<int>(number_of(in, at + "group", flag)),
                     number_of(in, at + "backward", flag) != 0};
    slots_[j].copy.load_state(at, in, flag);
  }
}

namespace {

// The predictions as the updates' hooks: every pass runs on its prediction, and each step
// records the direction the next predictions extrapolate along.
class PredictionHooks final : public StageHooks {
 public:
  PredictionHooks(const VersionRule& rule, int stage, const std::function<Stage()>& make_copy)
      : prediction_(rule, stage, make_copy) {}

  Stage& weights(int mb, bool backward, StageVersions& versions) override {
    return prediction_.weights(mb, backward, versions);
  }
  void gradients_to(Stage& target) override { prediction_.gradients_to(target); }
  void after_update(const StageUpdate& update) override {
    prediction_.record(update.live_version, update.optimizer.direction(update.live), update.lr);
    prediction_.release_older_than(update.oldest_needed);
  }
  int versions_held() const override { return prediction_.held(); }
  void save_state(const std::string& prefix, NamedTensors& out) const override {
    prediction_.save_state(prefix, out);
  }
  void load_state(const std::string& prefix, const NamedTensors& in,
                  const std::string& flag) override {
    prediction_.load_state(prefix, in, flag);
  }

 private:
  WeightPrediction prediction_;
};

}  // namespace

std::unique_ptr<StageHooks> make_weight_prediction(const VersionRule& rule, Stage* live,
                                                   const std::function<Stage()>& make_copy) {
  return std::make_unique<PredictionHooks>(rule, live->index(), make_copy);
}

}  // namespace pptrain
