#include "pptrain/train/weight_prediction.h"

#include "pptrain/common/check.h"

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

}  // namespace pptrain
