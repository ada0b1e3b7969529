#include "pptrain/runtime/stage.h"

#include <algorithm>
#include <filesystem>

#include "pptrain/common/check.h"
#include "pptrain/device/precision.h"

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

TensorBundle Stage::forward(const TensorBundle& input, std::optional<c10::ScalarType> compute,
                            const std::vector<std::string>& keep) {
  std::optional<AutocastScope> autocast;
  if (compute) autocast.emplace(compute);
  TensorBundle x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (bundle_layers_[i]) {
      x = layers_[i].forward<TensorBundle>(x);
    } else {
      PPTRAIN_CHECK(x.size() == 1, "stage ", index_, ": layer ", first_layer_ + static_cast<int>(i),
                    " (", layers_[i].ptr()->name(), ") takes one tensor, but was given ",
                    x.describe());
      x = layers_[i].forward(x[0]);
    }
    if (compute) x = with_dtype(std::move(x), torch::kFloat32, *compute, keep);
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

namespace {

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// What Module::save writes (its parameters, its buffers, then each child's archive under the
// child's name), leaving out the parameters whose dotted names `left_out` lists.
// With `copy`, of copies of the tensors (kept by `file`).
void write_module(const torch::nn::Module& module, torch::serialize::OutputArchive& archive,
                  const std::string& prefix, const std::vector<std::string>& left_out, bool copy,
                  ArchiveFile& file) {
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    if (!listed(left_out, prefix + parameter.key())) {
      archive.write(parameter.key(), file.keep(*parameter, copy));
    }
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    archive.write(buffer.key(), file.keep(*buffer, copy), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive nested(archive.compilation_unit());
    write_module(*child.value(), nested, prefix + child.key() + ".", left_out, copy, file);
    archive.write(child.key(), nested);
  }
}

// What Module::load reads, where the parameters `left_out` lists may be missing. Returns the
// dotted name of a parameter or buffer the archive lacks ("" when none).
std::string read_module(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                        const std::string& prefix, const std::vector<std::string>& left_out) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : module.named_parameters(/*recurse=*/false)) {
    const bool found = archive.try_read(parameter.key(), parameter.value());
    if (!found && !listed(left_out, prefix + parameter.key())) return prefix + parameter.key();
  }
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) {
    if (!archive.try_read(buffer.key(), buffer.value(), /*is_buffer=*/true)) {
      return prefix + buffer.key();
    }
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive nested;
    if (!archive.try_read(child.key(), nested)) return prefix + child.key();
    const std::string missing =
        read_module(*child.value(), nested, prefix + child.key() + ".", left_out);
    if (!missing.empty()) return missing;
  }
  return "";
}

const std::vector<std::string>& left_out_of(const LeftOut& left_out, int layer) {
  static const std::vector<std::string> kNone;
  const auto found = left_out.find(layer);
  return found == left_out.end() ? kNone : found->second;
}

}  // namespace

ArchiveFile layer_archive(const torch::nn::Module& module, const std::string& name,
                          const std::vector<std::string>& left_out, bool copy) {
  ArchiveFile file(name);
  write_module(module, *file.archive, "", left_out, copy, file);
  return file;
}

void load_layer(torch::nn::Module& module, const std::string& path,
                const std::vector<std::string>& left_out, const std::string& flag) {
  PPTRAIN_CHECK(std::filesystem::exists(path), flag, ": missing parameter file '", path, "'");
  std::string missing;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    missing = read_module(module, archive, "", left_out);
  } catch (const c10::Error& e) {
    PPTRAIN_CHECK(false, flag, ": cannot read '", path, "': ", e.what_without_backtrace());
  }
  PPTRAIN_CHECK(missing.empty(), flag, ": '", path, "' has no '", missing, "'");
}

std::vector<ArchiveFile> Stage::archives(const LeftOut& left_out, bool copy) const {
  std::vector<ArchiveFile> files;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int layer = first_layer_ + static_cast<int>(i);
    files.push_back(layer_archive(*layers_[i].ptr(), layer_file("", layer),
                                  left_out_of(left_out, layer), copy));
  }
  return files;
}

void Stage::save(const std::string& dir, const LeftOut& left_out) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);  // another rank may create it at the same time
  PPTRAIN_CHECK(std::filesystem::is_directory(dir), "cannot create the --save folder '", dir, "'");
  for (const ArchiveFile& file : archives(left_out, /*copy=*/false)) write_archive_file(file, dir);
}

void Stage::load(const std::string& dir, const LeftOut& left_out) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int layer = first_layer_ + static_cast<int>(i);
    const std::string path = layer_file(dir, layer);
    try {
      load_layer(*layers_[i].ptr(), path, left_out_of(left_out, layer));
    } catch (const UserError& e) {
      PPTRAIN_CHECK(false, e.what(), " (layer ", layer, ")");
    }
  }
}

std::pair<int, std::string> Stage::find_parameter(const torch::Tensor& tensor) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (const auto& parameter : layers_[i].ptr()->named_parameters()) {
      if (parameter.value().is_same(tensor)) {
        return {first_layer_ + static_cast<int>(i), parameter.key()};
      }
    }
  }
  return {-1, ""};
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
