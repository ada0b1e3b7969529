// How a rank's stages are updated: clipping, the optimizer step of a synchronous step (plain or
// post-validated), and the steps an asynchronous schedule takes between its microbatches on
// weight versions.
//
//   RankWeights weights(stages, make_copies, rule, optimizer, family, keeps, serial);
//   // synchronous: after the flush
//   double norm = clip_grad_norm(weights.params, optimizer.clip, &pipeline, &counted);
//   for (auto& o : weights.optimizers) { o.set_lr(optimizer.lr_at(step)); o.step(); }
//   // asynchronous: the executor's hooks
//   AsyncUpdates async(rule, optimizer, weights);
//   options.weights = [&](int s, int mb, bool backward) -> Stage& { return async.weights(...); };
//   options.after_backward = [&](int s, int mb) { async.after_backward(s, mb); };
//
// The rules (which version a microbatch uses, when a stage steps) are schedule/weight_versions.h;
// this file applies them to tensors. docs/ASYNC.md has the schedules.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/stage_versions.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/train/optimizer.h"
#include "pptrain/train/stage_hooks.h"
#include "pptrain/train/tied_parameters.h"

namespace pptrain {

// What one rank keeps to update its stages: their parameters with gradients that live from the
// start (zeroed in place, so a step's memory peak counts only what the step allocates), one
// optimizer per stage (stages of an asynchronous schedule step at different times), each stage's
// weight versions and its family's hooks (train/stage_hooks.h).
struct RankWeights {
  // `stages`: this rank's, not owned. `make_copy[l]` builds a Stage of the same layers as
  // stages[l] (any values): the copies versions and predictions are kept in. `keeps(layer)`:
  // whether this rank keeps the optimizer state of that layer (--zero 1); unset: all. `serial`:
  // the one-process run of an asynchronous rule (one rank running every stage in turn), which
  // keeps its versions as snapshots since it runs later forwards before the same backwards.
  // `family`: the options of the rule's family that were given, for its hooks.
  RankWeights(std::vector<Stage*> stages, const std::vector<std::function<Stage()>>& make_copy,
              const VersionRule& rule, const OptimizerOptions& optimizer,
              const FamilyValues& family, const std::function<bool(int layer)>& keeps, bool serial);

  std::vector<Stage*> stages;
  std::vector<torch::Tensor> params;       // every stage's, in order
  std::vector<StageOptimizer> optimizers;  // [local stage]
  std::vector<StageVersions> versions;     // [local stage]
  // [local stage]: the family's hooks, empty when it has none (train/stage_hooks.h).
  std::vector<std::unique_ptr<StageHooks>> hooks;
  std::map<int, int> local;  // global stage index -> local stage
};

// Gradient norm over `params` (with a transport, one all-reduce of the squared norm, summed in
// float64, makes it global), then scaling to max_norm as torch.nn.utils.clip_grad_norm_ does.
// Returns the norm before clipping. `counted`: the parameters whose norm this rank adds, when
// not all of `params` (a replicated stage's gradients are counted by one of its replicas only).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      Transport* transport, const std::vector<torch::Tensor>* counted = nullptr);

// A synchronous optimizer step with post-validation (the zero-bubble paper's section 4): no
// all-reduce before it. Pipeline rank r receives the sum of the squared gradient norms of ranks
// 0 .. r-1, adds its own and passes it on; it steps at once unless that partial sum already
// calls for clipping or is not finite (the sums only grow along the chain, so a partial sum that
// triggers means the full one does). The last rank sends the full sum back to every rank, which
// then takes its step back when the full norm calls for clipping (and steps again on the
// clipped gradients) or is not finite (and leaves the step to the caller). Returns the global
// norm; `rollbacks` is 1 when this rank took its step back.
double post_validated_step(const OptimizerOptions& optimizer, int step, RankWeights& weights,
                           const std::vector<torch::Tensor>& counted, Transport& pipeline,
                           int& rollbacks);

// The optimizer steps of an asynchronous schedule, run by the executor after each backward.
// When the rule says the stage steps, the gradients summed on the version the backwards since
// its last step used (one version: every rule has a step's backwards on one) go to the live
// weights, the stage clips its own gradient norm (no other stage has finished the same step),
// steps, and keeps or frees versions as the rule needs them.
class AsyncUpdates {
 public:
  // None is owned. `tied`: the rank's tied parameters (pipedream and 2bw), or null; their
  // updates follow the rule of train/tied_parameters.h, and finish() ends them.
  AsyncUpdates(const VersionRule& rule, const OptimizerOptions& optimizer, RankWeights& weights,
               TiedParameters* tied = nullptr);

  // The weights a forward or backward of microbatch `mb` runs on at `stage`.
  Stage& weights(int stage, int mb, bool backward);
  void after_backward(int stage, int mb);
  // After the run's last step (`steps` of them): the tied parameters' copies take the updates
  // they still owe, and are equal.
  void finish(int steps);

  // The squared norm of each stage's latest step, summed over this rank's stages.
  double grad_norm_squared() const;
  // The most versions one stage held since the last call.
  int take_most_held() { return std::exchange(most_held_, 1); }
  // The most bytes of weights this rank's stages held since the last call: each stage's most
  // copies (versions and the hooks' copies) times its bytes.
  int64_t take_weight_bytes();

  // For a checkpoint between two steps: what the rank's stages hold beyond their weights and
  // optimizer state (their versions, gradients summed since their last step, their hooks'
  // state), under "stage/<s>/"; and back, in a new
  // process (UserError starting with `flag`).
  void save_state(NamedTensors& out) const;
  void load_state(const NamedTensors& in, const std::string& flag);

 private:
  const VersionRule& rule_;
  const OptimizerOptions& optimizer_;
  RankWeights& model_;
  TiedParameters* tied_;
  std::map<int, double> latest_squared_;
  std::map<int, int> pending_version_;  // stage -> version of its backwards since its last step
  int most_held_ = 1;
  std::map<size_t, int> most_copies_;  // [local stage] -> most weight copies since the last take

  // The optimizer step of local stage l in step `step` (0-based), its hooks' rate and
  // before_step() with it (a stage's k-th step is in step k).
  void step(int l, int step);
  // Records local stage l's copies now: versions and the hooks' versions held, and beside them
  // the hooks' buffers (weight bytes).
  void note_held(size_t l);
};

// Bytes of a stage's parameters: one copy of its weights.
int64_t parameter_bytes(const Stage& stage);

}  // namespace pptrain
