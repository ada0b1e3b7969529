// The optimizer of one stage, with its state saved per model layer like the parameters.
//
// It is one torch optimizer per layer of the stage. SGD and AdamW update each parameter on its
// own, so this computes exactly what one optimizer over the whole stage would; what it adds is
// that a layer's momentum or moments live in DIR/optim_<layer>.pt, next to DIR/layer_<layer>.pt,
// and a run split into other stages can resume from them.
//
//   StageOptimizer optimizer(plan.optimizer, stage);   // OptimizerOptions: "sgd" or "adamw"
//   optimizer.set_lr(plan.optimizer.lr_at(step));
//   optimizer.step();                        // the gradients in the stage's parameters' .grad()
//   optimizer.save("ckpt");                  // ckpt/optim_<i>.pt for each layer i of the stage
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/planner/run_request.h"
#include "pptrain/runtime/archive_file.h"
#include "pptrain/runtime/stage.h"

namespace pptrain {

// OptimizerOptions, the settings, are planner/run_request.h's (with the run they belong to).

class StageOptimizer {
 public:
  // `keeps(layer)`: whether this rank keeps the optimizer (and its state) of that model layer;
  // unset: every layer. With --zero 1 a copy keeps only the layers it owns: it steps, saves and
  // loads only those.
  StageOptimizer(const OptimizerOptions& options, const Stage& stage,
                 const std::function<bool(int layer)>& keeps = {});

  void set_lr(double lr);
  void step();
  // Post-validation (--post-validation): a step that may be taken back. step_undoably() steps
  // as step() does and remembers what undo_step() needs to return the parameters and the state
  // to where they were: with `exact`, copies of both (bit for bit); otherwise only which
  // parameters had no state yet, and undo_step() inverts the update algebraically from the
  // gradients (still in .grad()) and the state (AdamW: the zero-bubble paper's Algorithm 1;
  // SGD: p += lr x buf, buf = (buf - g) / momentum), which is exact up to rounding.
  void step_undoably(bool exact);
  void undo_step();
  // The direction of the next step, per parameter of `stage` (the stage it was made for), in
  // its parameters' order: a step with rate lr moves each parameter by about -lr x direction.
  // SGD: the momentum buffer; AdamW: m_hat / (sqrt(v_hat) + eps) + weight_decay x p, from the
  // moments after its last step. Zeros before the first step, and for a layer this rank does
  // not keep (--zero 1). Weight prediction (train/weight_prediction.h) extrapolates along it.
  std::vector<torch::Tensor> direction(const Stage& stage) const;
  // Bytes of the optimizer state held now (momentum buffers, AdamW's two moments); 0 before
  // the first step.
  int64_t state_bytes() const;
  // Bytes of the parameters whose state it keeps (all of the stage's, or under --zero 1 those
  // of the layers this rank owns).
  int64_t kept_parameter_bytes() const;

  // One file per layer: DIR/optim_<model layer index>.pt. archives() are those files in memory
  // (with `copy`, of copies of the state, which later steps leave alone); save() writes them
  // (std::runtime_error naming the file when it cannot). load(): UserError if a file cannot be
  // read or does not fit the layer's parameters. The state of a parameter store_elsewhere()
  // names is left out of its file (a tied copy's, stored once with the first copy's).
  std::vector<ArchiveFile> archives(bool copy) const;
  void save(const std::string& dir) const;
  void load(const std::string& dir);
  void store_elsewhere(const torch::Tensor& parameter) { elsewhere_.push_back(parameter); }

  // The state of `parameter` as tensors (SGD: the momentum buffer; AdamW: the two moments and
  // the step count as a float64 scalar); empty when it has none yet, or is not one of this
  // optimizer's parameters. state_like() is zeros of those shapes; set_state() gives a
  // parameter that state, making it when there is none.
  std::vector<torch::Tensor> state_of(const torch::Tensor& parameter) const;
  std::vector<torch::Tensor> state_like(const torch::Tensor& parameter) const;
  void set_state(const torch::Tensor& parameter, const std::vector<torch::Tensor>& state);
  bool holds(const torch::Tensor& parameter) const { return optimizer_of(parameter) != nullptr; }

 private:
  int first_layer_;
  // [layer of the stage]; null for a layer without parameters.
  std::vector<std::unique_ptr<torch::optim::Optimizer>> layers_;
  std::vector<torch::Tensor> elsewhere_;  // parameters whose state save() leaves out

  torch::optim::Optimizer* optimizer_of(const torch::Tensor& parameter) const;
  // What undo_step() needs of the last step_undoably(), per parameter of every kept layer.
  struct Undo {
    bool exact = false;
    std::vector<bool> had_state;
    std::vector<torch::Tensor> params;               // exact: the parameters before the step
    std::vector<std::vector<torch::Tensor>> states;  // exact: their state tensors before it
    std::vector<int64_t> steps;                      // exact: AdamW's step counts before it
  };
  std::optional<Undo> undo_;
};

// The torch optimizer `options` names over `params` (null when there are none): what each layer
// of a StageOptimizer holds, and a tied parameter's own under an asynchronous schedule.
std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(
    const OptimizerOptions& options, const std::vector<torch::Tensor>& params);
// Sets the learning rate of every parameter group of `optimizer`.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Path of one layer's optimizer-state file in a checkpoint folder.
std::string optimizer_file(const std::string& dir, int layer);

}  // namespace pptrain
