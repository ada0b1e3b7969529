// One pipeline stage: a consecutive range of a model's layers, held by the rank that runs it.
//
// A rank holds one Stage per stage of the schedule that it runs (several with interleaving or a
// V placement), keyed by the global stage index. Parameters are saved one file per layer
// (DIR/layer_<index>.pt), so the layout does not depend on how the model was split and a run
// with any other split can load it.
//
//   Stage stage = make_stage(model, /*index=*/1, /*layers=*/{3, 5});
//   torch::Tensor y = stage.forward(x);      // layers 3, 4, 5 in order
//   stage.save("ckpt");                      // ckpt/layer_3.pt .. ckpt/layer_5.pt
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/models/model.h"
#include "pptrain/models/tensor_bundle.h"
#include "pptrain/runtime/archive_file.h"

namespace pptrain {

// Parameters a checkpoint does not store in their own layer's file: model layer -> the names
// of its parameters (as named_parameters() gives them, "lm_head.weight").
using LeftOut = std::map<int, std::vector<std::string>>;

class Stage {
 public:
  // `layers[i]` is layer `first_layer + i` of the model. `bundle_layers[i]`: layer i's forward
  // takes and returns a TensorBundle (models/tensor_bundle.h); otherwise, and when
  // `bundle_layers` is empty, it takes one tensor and returns one.
  Stage(int index, int first_layer, std::vector<torch::nn::AnyModule> layers,
        std::vector<bool> bundle_layers = {});

  int index() const { return index_; }
  int first_layer() const { return first_layer_; }
  int last_layer() const { return first_layer_ + static_cast<int>(layers_.size()) - 1; }

  // Runs the layers in order. UserError naming the layer when a layer that takes one tensor is
  // given a bundle of another size. `compute` (a bf16 or fp16 run, device/precision.h): the
  // layers run under autocast to it, and each layer's float32 outputs are cast to it, so that
  // the activations between layers, and so the messages at any cut, are in that dtype whichever
  // way the model is split (a pipeline computes what one process does); the tensors of a map
  // named in `keep` (PipelineStage::keep_dtype) stay as they are.
  TensorBundle forward(const TensorBundle& input,
                       std::optional<c10::ScalarType> compute = std::nullopt,
                       const std::vector<std::string>& keep = {});
  torch::Tensor forward(const torch::Tensor& input) { return forward(TensorBundle(input)).only(); }
  std::vector<torch::Tensor> parameters() const;
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // The parameters of layer first_layer() + i; parameters() is all of them in layer order.
  std::vector<torch::Tensor> layer_parameters(int i) const;

  // The layers, in order, and which of them take a bundle.
  const std::vector<torch::nn::AnyModule>& layers() const { return layers_; }
  const std::vector<bool>& bundle_layers() const { return bundle_layers_; }
  // The layers' modules, in order (to switch them between training and eval mode).
  std::vector<std::shared_ptr<torch::nn::Module>> modules() const;

  // One file per layer: DIR/layer_<model layer index>.pt. archives() are those files in memory
  // (with `copy`, of copies of the parameters, which training may go on changing); save()
  // writes them (std::runtime_error naming the file when it cannot). load() reads them back:
  // UserError if a file cannot be read or does not match the layer. `left_out`: parameters that
  // are stored elsewhere (a tied copy, stored once with the first copy), which the files leave
  // out and load() reads only when the file has them.
  std::vector<ArchiveFile> archives(const LeftOut& left_out, bool copy) const;
  void save(const std::string& dir, const LeftOut& left_out = {}) const;
  void load(const std::string& dir, const LeftOut& left_out = {});
  // Where `tensor` is among the stage's parameters: (model layer, its name in that layer's
  // named_parameters()); (-1, "") when it is none of them.
  std::pair<int, std::string> find_parameter(const torch::Tensor& tensor) const;

 private:
  int index_;
  int first_layer_;
  std::vector<torch::nn::AnyModule> layers_;
  std::vector<bool> bundle_layers_;  // one per layer
};

// Builds stage `index` from the model's layers [layers.first, layers.second] (inclusive).
Stage make_stage(const ModelOptions& model, int index, std::pair<int, int> layers);

// Path of one layer's parameter file in a --save/--load folder.
std::string layer_file(const std::string& dir, int layer);

// One layer's file as torch::save(module) writes it, without the parameters named in
// `left_out` (of copies of the tensors with `copy`); and back into `module`, where those may be
// missing (they keep their values). UserError naming the file when it cannot be read, or lacks
// another parameter.
ArchiveFile layer_archive(const torch::nn::Module& module, const std::string& name,
                          const std::vector<std::string>& left_out, bool copy);
void load_layer(torch::nn::Module& module, const std::string& path,
                const std::vector<std::string>& left_out, const std::string& flag = "--load");

}  // namespace pptrain
