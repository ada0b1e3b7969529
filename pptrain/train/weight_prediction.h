// Weight prediction for the asynchronous rules that run an action on estimated weights instead
// of a stored version (spectrain, xpipe; schedule/weight_versions.h, docs/ASYNC.md).
//
// A stage's action on microbatch i starts from version v of its weights (the rule's forward or
// backward version) and runs on W^(v) - lag x lr x d^(v): d^(v) is the stage optimizer's
// direction after the step that made v (StageOptimizer::direction: SGD's momentum buffer,
// AdamW's m_hat / (sqrt(v_hat) + eps) + decay x W), lr that step's rate, lag the rule's
// prediction_lag. Because v, d^(v) and lr are fixed by the rule, the pipelined run and the
// one-process run predict the same weights. The prediction is made at the first microbatch of
// a prediction group (xpipe: the mini-batch) and reused by the others.
//
//   WeightPrediction prediction(rule, /*stage=*/1, make_copy);
//   Stage& w = prediction.weights(i, /*backward=*/false, versions);   // forward on w
//   Stage& b = prediction.weights(i, /*backward=*/true, versions);    // backward on b
//   prediction.gradients_to(versions.weights(rule.backward_version(i, 1)));
//   ... optimizer step, versions.stepped() ...
//   prediction.record(versions.live_version(), optimizer.direction(stage), lr);
//   prediction.release_older_than(rule.oldest_needed_after(i, 1));
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/stage_versions.h"
#include "pptrain/runtime/tensor_file.h"
#include "pptrain/schedule/weight_versions.h"

namespace pptrain {

// A copy of a stage's weights moved along a direction, W - scale x d parameter by parameter: an
// action runs on the copy, and its gradients go back to the weights the copy stands for.
class ShiftedWeights {
 public:
  // `make_copy` builds a Stage of the same layers (any values); called once, at the first shift.
  explicit ShiftedWeights(std::function<Stage()> make_copy) : make_copy_(std::move(make_copy)) {}

  // The copy, set to base - scale x direction (base itself when `direction` is empty).
  Stage& shift(const Stage& base, const std::vector<torch::Tensor>& direction, double scale);
  // Adds the gradients on the copy to `target`'s and zeros the copy's.
  void gradients_to(Stage& target);
  bool made() const { return copy_.has_value(); }
  // For a checkpoint: the copy's weights and gradients, if made; and back.
  void save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const std::string& prefix, const NamedTensors& in, const std::string& flag);
  Stage& stage() { return *copy_; }  // the copy as last shifted; made() must be true

 private:
  std::function<Stage()> make_copy_;
  std::optional<Stage> copy_;
};

class WeightPrediction {
 public:
  WeightPrediction(const VersionRule& rule, int stage, const std::function<Stage()>& make_copy);

  // The weights the forward or backward of microbatch `mb` runs on: the predicted copy, or the
  // version itself (from `versions`) when the pass's lag is 0.
  Stage& weights(int mb, bool backward, StageVersions& versions);
  // After a backward on weights(mb, true, ...): its gradients to `target`, the stage holding
  // its version. Nothing to do when it ran on the version itself.
  void gradients_to(Stage& target);
  // The stage's optimizer stepped and its weights are now `version`: the direction and rate
  // predictions from `version` extrapolate with.
  void record(int version, std::vector<torch::Tensor> direction, double lr);
  // Forgets the directions of versions older than `version` (no later action starts there).
  void release_older_than(int version);
  // Predicted copies this stage has made (each kept for reuse): what it holds beside its
  // versions.
  int held() const;

  // For a checkpoint between steps: the directions recorded and the predictions kept, under
  // `prefix`; and back (UserError starting with `flag`).
  void save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const std::string& prefix, const NamedTensors& in, const std::string& flag);

 private:
  struct Direction {
    std::vector<torch::Tensor> tensors;
    double lr = 0;
  };
  // One prediction kept for its group: spectrain's two passes share one (group 1, one at a
  // time), xpipe keeps the mini-batch's forward and backward predictions side by side.
  struct Slot {
    explicit Slot(const std::function<Stage()>& make_copy) : copy(make_copy) {}
    std::pair<int, bool> key{-1, false};  // (group, backward) it holds the prediction for
    ShiftedWeights copy;
  };

  VersionRule rule_;
  int stage_;
  std::vector<Slot> slots_;
  std::map<int, Direction> directions_;  // version -> its direction; none for version 0
  ShiftedWeights* pending_ = nullptr;    // the copy the last backward ran on, if any
};

}  // namespace pptrain
