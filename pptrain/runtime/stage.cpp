#include "pptrain/runtime/stage.h"

#include <filesystem>

#include "pptrain/common/check.h"

namespace pptrain {

Stage::Stage(int index, int first_layer, std::vector<torch::nn::AnyModule> layers,
             std::vector<bool> bundle_layers)
    : index_(index),
      first_layer_(first_layer),
      layers_(std::move(layers)),
      bundle_layers_(std::move(bundle_layers)) {
  PPTRAIN_ASSERT(!layers_.empty(), "stage ", index, " has no layers");
  if (bundle_layers_.empty()) bundle_layers_.assign(layers_.size(), false);
  PPTRAIN_ASSERT(bundle_layers_.size() == layers_.size());
}

TensorBundle Stage::forward(const TensorBundle& input) {
  TensorBundle x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (bundle_layers_[i]) {
      x = layers_[i].forward<TensorBundle>(x);
      continue;
    }
    PPTRAIN_CHECK(x.size() == 1, "stage ", index_, ": layer ", first_layer_ + static_cast<int>(i),
                  " (", layers_[i].ptr()->name(), ") takes one tensor, but was given ",
                  x.describe());
    x = layers_[i].forward(x[0]);
  }
  return x;
}

std::vector<std::shared_ptr<torch::nn::Module>> Stage::modules() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& layer : layers_) out.push_back(layer.ptr());
  return out;
}

std::vector<torch::Tensor> Stage::parameters() const {
  std::vector<torch::Tensor> params;
  for (int i = 0; i < num_layers(); ++i) {
    for (const auto& p : layer_parameters(i)) params.push_back(p);
  }
  return params;
}

std::vector<torch::Tensor> Stage::layer_parameters(int i) const {
  return layers_.at(i).ptr()->parameters();
}

std::string layer_file(const std::string& dir, int layer) {
  return (std::filesystem::path(dir) / ("layer_" + std::to_string(layer) + ".pt")).string();
}

void Stage::save(const std::string& dir) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);  // another rank may create it at the same time
  PPTRAIN_CHECK(std::filesystem::is_directory(dir), "cannot create the --save folder '", dir, "'");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string path = layer_file(dir, first_layer_ + static_cast<int>(i));
    try {
      torch::save(layers_[i].ptr(), path);
    } catch (const c10::Error& e) {
      PPTRAIN_CHECK(false, "cannot write '", path, "': ", e.what_without_backtrace());
    }
  }
}

void Stage::load(const std::string& dir) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string path = layer_file(dir, first_layer_ + static_cast<int>(i));
    PPTRAIN_CHECK(std::filesystem::exists(path), "--load: missing parameter file '", path, "'");
    try {
      auto module = layers_[i].ptr();
      torch::load(module, path);
    } catch (const c10::Error& e) {
      PPTRAIN_CHECK(false, "--load: cannot read '", path, "' into layer ", first_layer_ + i, ": ",
                    e.what_without_backtrace());
    }
  }
}

Stage make_stage(const ModelOptions& model, int index, std::pair<int, int> layers) {
  std::vector<torch::nn::AnyModule> modules;
  std::vector<bool> bundles;
  for (int i = layers.first; i <= layers.second; ++i) {
    modules.push_back(make_layer(model, i));
    bundles.push_back(layer_takes_bundle(model, i));
  }
  return Stage(index, layers.first, std::move(modules), std::move(bundles));
}

}  // namespace pptrain
