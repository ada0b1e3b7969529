// Parameters that several stages share: GPT's token embedding on the first stage and its output
// head on the last (weight tying). Each stage keeps its own copy; the copies start equal, their
// gradients are summed over every copy before the optimizer step (one all-reduce over the ranks
// that hold them), and every copy then takes the same step, so they stay equal bit for bit:
// what one shared tensor in one process computes.
//
//   TiedCopies embedding{"embedding", {0, 7}, {{0, token_table}}, group.view};
//   TiedParameters tied({embedding});
//   tied.agree();            // before training: same shapes everywhere, the first stage's values
//   ...the step's backwards...
//   tied.sum_gradients();    // then clip and step as usual
//
// Under an asynchronous schedule (pipedream, 2bw) each stage steps on its own, and the first
// stage finishes an update after the others: there a tied parameter's first copy takes update u
// with the sum of every copy's gradients of update u, and the other copies take that same
// update (the first copy's clipped gradient, at update u's rate) `lag` updates later, when it
// has surely arrived; after the run's last update they take the ones still owed. The copies
// are then equal after the same number of updates, and equal at the end; the one-process run
// of the rule does the same in the same order (docs/ASYNC.md).
//
//   tied.use_asynchronously(optimizer, lag, rate_of_update);
//   ...AsyncUpdates calls before_async_step(stage, u) and after_async_step(stage, u, stepped)
//   tied.finish_async(last_update);
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pptrain/runtime/transport.h"
#include "pptrain/train/optimizer.h"

namespace pptrain {

// One shared parameter as one rank sees it.
struct TiedCopies {
  std::string name;
  std::vector<int> stages;  // every stage that holds a copy, ascending
  // This rank's copies: (stage, tensor), in stage order; a stage may hold several (a one-process
  // run holds the embedding and the head in one stage).
  std::vector<std::pair<int, torch::Tensor>> local;
  // The ranks holding copies, this one among them; null when this rank holds them all.
  Transport* group = nullptr;
  // The rank in `group` that holds each stage's copy, in the order of `stages` (asynchronous
  // schedules send gradients between them); empty without a group.
  std::vector<int> ranks;
};

class TiedParameters {
 public:
  TiedParameters() = default;
  explicit TiedParameters(std::vector<TiedCopies> ties) : ties_(std::move(ties)) {}

  bool empty() const { return ties_.empty(); }
  // A collective over each tie's group. UserError naming the tie and the two stages when copies
  // differ in shape or dtype; then every copy takes the values of the copy on the lowest stage.
  void agree();
  // After optimizer state was loaded from a checkpoint, which stores a tied parameter's state
  // once (with the first copy): every copy takes the first copy's state, from whichever of
  // `optimizers` holds it. A collective over each tie's group, as agree().
  void agree_state(const std::vector<StageOptimizer*>& optimizers);
  // Every copy's gradient becomes the sum of all copies' gradients (undefined ones count as 0).
  void sum_gradients();
  // Whether `tensor` is a copy other than the first of its tie: the gradient norm counts a tied
  // parameter once.
  bool is_extra_copy(const torch::Tensor& tensor) const;

  // Asynchronous schedules (see the top of this file). `lag`: the updates by which the other
  // copies follow the first; `rate(u)`: the learning rate of update u.
  void use_asynchronously(const OptimizerOptions& optimizer, int lag,
                          std::function<double(int update)> rate);
  // When stage `stage` takes its update `update`, before it clips its gradients: the first
  // copy adds the other copies' gradients of the update (waiting for them); another copy sends
  // its own there and leaves the update to the first (its gradient is undefined until
  // after_async_step, so the stage's clipping and optimizer pass it by).
  void before_async_step(int stage, int update);
  // After the stage's optimizer step (`stepped`: false when it skipped a non-finite one): the
  // first copy sends what it applied to the others; another copy applies the first copy's
  // update `update - lag` with its own optimizer.
  void after_async_step(int stage, int update, bool stepped);
  // After the run's last update: the other copies apply the updates they still owe, and every
  // gradient sent has arrived.
  void finish_async(int last_update);

 private:
  // A stage's copies off the first stage under an asynchronous schedule, with their own
  // optimizer (the stage's passes them by), which takes the first copy's updates.
  struct Follower {
    std::vector<torch::Tensor> copies;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
  };

  std::vector<TiedCopies> ties_;
  const OptimizerOptions* optimizer_ = nullptr;  // set by use_asynchronously()
  int lag_ = 1;
  std::function<double(int)> rate_;
  std::map<std::pair<size_t, int>, Follower> followers_;  // (tie, stage)
  // Gradients between copies on this rank: (tie, from stage, to stage, update) -> gradient.
  std::map<std::tuple<size_t, int, int, int>, torch::Tensor> local_mail_;
  std::deque<std::pair<int, PendingComm>> sends_;  // (update, send) not yet waited on

  // This rank's copies of tie `t` on `stage` (one per tensor).
  std::vector<torch::Tensor> copies_on(size_t t, int stage) const;
  void deliver(size_t t, int from, int to, int update, torch::Tensor gradient);
  torch::Tensor collect(size_t t, int from, int to, int update, const torch::Tensor& like);
  // The follower on `stage` applies the first copy's update `update`.
  void apply_update(size_t t, int stage, int update);
};

}  // namespace pptrain
