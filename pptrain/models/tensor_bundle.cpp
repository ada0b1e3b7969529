#include "pptrain/models/tensor_bundle.h"

#include <algorithm>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

void check_name(const std::string& name) {
  PPTRAIN_CHECK(!name.empty() && name.find_first_of("/:") == std::string::npos,
                "a tensor's name in a bundle must be non-empty without '/' or ':', got '", name,
                "'");
}

std::string shape_text(const torch::Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + "]";
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return "float32";
    case torch::kFloat64:
      return "float64";
    case torch::kFloat16:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt64:
      return "int64";
    case torch::kInt32:
      return "int32";
    case torch::kInt16:
      return "int16";
    case torch::kInt8:
      return "int8";
    case torch::kUInt8:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

TensorBundle::TensorBundle(torch::Tensor tensor) {
  if (tensor.defined()) tensors_.push_back(std::move(tensor));
}

TensorBundle::TensorBundle(std::vector<torch::Tensor> tensors) : tensors_(std::move(tensors)) {}

TensorBundle::TensorBundle(std::vector<std::pair<std::string, torch::Tensor>> named) {
  for (auto& [name, tensor] : named) add(name, std::move(tensor));
}

const torch::Tensor& TensorBundle::operator[](size_t i) const {
  PPTRAIN_CHECK(i < tensors_.size(), "tensor #", i, " of a bundle of ", tensors_.size(), " (",
                describe(), ")");
  return tensors_[i];
}

torch::Tensor& TensorBundle::operator[](size_t i) {
  PPTRAIN_CHECK(i < tensors_.size(), "tensor #", i, " of a bundle of ", tensors_.size(), " (",
                describe(), ")");
  return tensors_[i];
}

const torch::Tensor& TensorBundle::operator[](const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  PPTRAIN_CHECK(it != names_.end(), "no tensor '", name, "' in a bundle of ", describe());
  return tensors_[static_cast<size_t>(it - names_.begin())];
}

bool TensorBundle::contains(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

const torch::Tensor& TensorBundle::only() const {
  PPTRAIN_CHECK(tensors_.size() == 1, "one tensor expected, got ", describe());
  return tensors_[0];
}

void TensorBundle::push_back(torch::Tensor tensor) {
  PPTRAIN_CHECK(names_.empty(), "an unnamed tensor added to a bundle of named ones (", describe(),
                ")");
  tensors_.push_back(std::move(tensor));
}

void TensorBundle::add(const std::string& name, torch::Tensor tensor) {
  check_name(name);
  PPTRAIN_CHECK(names_.size() == tensors_.size(), "a named tensor '", name, "' added to a list (",
                describe(), ")");
  PPTRAIN_CHECK(!contains(name), "two tensors named '", name, "' in one bundle");
  names_.push_back(name);
  tensors_.push_back(std::move(tensor));
}

std::string TensorBundle::label(size_t i) const {
  return named() ? names_.at(i) : "#" + std::to_string(i);
}

std::string TensorBundle::describe() const {
  if (tensors_.empty()) return "no tensors";
  std::string text;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const torch::Tensor& t = tensors_[i];
    text += (i ? ", " : "") + label(i) + " ";
    text +=
        t.defined() ? dtype_name(t.scalar_type()) + " " + shape_text(t) : std::string("undefined");
  }
  return text;
}

TensorBundle TensorBundle::without(const std::vector<std::string>& names) const {
  if (!named()) return *this;
  TensorBundle out;
  for (size_t i = 0; i < size(); ++i) {
    if (std::find(names.begin(), names.end(), names_[i]) == names.end())
      out.add(names_[i], tensors_[i]);
  }
  return out;
}

bool carries_gradient(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.is_floating_point();
}

TensorBundle gradient_bundle(const TensorBundle& forward, const std::vector<torch::Tensor>& grads) {
  PPTRAIN_ASSERT(grads.size() == forward.size(), grads.size(), " gradients for ", forward.size(),
                 " tensors");
  TensorBundle out;
  for (size_t i = 0; i < forward.size(); ++i) {
    if (!carries_gradient(forward[i])) continue;
    if (forward.named()) {
      out.add(forward.names()[i], grads[i]);
    } else {
      out.push_back(grads[i]);
    }
  }
  return out;
}

std::vector<TensorBundle> split_bundle(const TensorBundle& bundle, int parts,
                                       const std::string& what) {
  std::vector<TensorBundle> out(bundle.empty() ? 0 : static_cast<size_t>(parts));
  for (size_t i = 0; i < bundle.size(); ++i) {
    const torch::Tensor& t = bundle[i];
    PPTRAIN_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % parts == 0, "the ", what, " tensor ",
                  bundle.label(i), " has ", t.defined() && t.dim() >= 1 ? t.size(0) : 0,
                  " rows, which do not split into ", parts, " equal microbatches");
    const auto chunks = t.chunk(parts, 0);
    for (int p = 0; p < parts; ++p) {
      if (bundle.named()) {
        out[p].add(bundle.names()[i], chunks[p].contiguous());
      } else {
        out[p].push_back(chunks[p].contiguous());
      }
    }
  }
  return out;
}

int64_t bundle_bytes(const TensorBundle& bundle) {
  int64_t bytes = 0;
  for (const auto& t : bundle.tensors()) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

TensorBundle on_device(TensorBundle bundle, const torch::Device& device) {
  for (size_t i = 0; i < bundle.size(); ++i) {
    torch::Tensor& t = bundle[i];
    if (t.defined() && t.device() != device) t = t.to(device);
  }
  return bundle;
}

TensorBundle with_dtype(TensorBundle bundle, c10::ScalarType from, c10::ScalarType to,
                        const std::vector<std::string>& keep) {
  for (size_t i = 0; i < bundle.size(); ++i) {
    torch::Tensor& t = bundle[i];
    const bool kept =
        bundle.named() && std::find(keep.begin(), keep.end(), bundle.names()[i]) != keep.end();
    if (t.defined() && t.scalar_type() == from && !kept) t = t.to(to);
  }
  return bundle;
}

}  // namespace pptrain
