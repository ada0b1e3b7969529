// What a layer or stage takes and returns: a bundle of tensors (what crosses a cut between stages).
//
// A stage's input and output are a TensorBundle: tensors in order, either a list or, when
// every tensor has a name, a map from names to tensors (kept in insertion order). Any dtype
// and any shape: a transformer stage passes its hidden states (float32 [mb, T, d_model]) with
// the position ids (int64 [mb, T]) and the attention mask (bool [mb, T]). One tensor alone is
// a bundle of one, so a plain torch::Tensor converts to it.
//
//   TensorBundle out({{"hidden", h}, {"positions", pos}, {"mask", mask}});
//   const torch::Tensor& mask = out["mask"];   // UserError naming what is there if absent
//   TensorBundle one = h;                      // a list of one tensor; one.only() is h
//
// Gradients travel back only for floating-point tensors (float32/64, bfloat16, half): ids and
// masks go forward only. The backward message of a bundle holds, for each of its
// floating-point tensors in order, the gradient (undefined where the receiving stage did not
// use the tensor). How a bundle travels between ranks: runtime/tensor_bundle.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pptrain {

class TensorBundle {
 public:
  TensorBundle() = default;
  // One unnamed tensor (undefined: an empty bundle).
  TensorBundle(torch::Tensor tensor);  // NOLINT(google-explicit-constructor): a tensor is a bundle
  // A list.
  TensorBundle(std::vector<torch::Tensor> tensors);  // NOLINT(google-explicit-constructor)
  // A map: names unique and non-empty, without '/' or ':' (UserError otherwise).
  TensorBundle(std::vector<std::pair<std::string, torch::Tensor>> named);  // NOLINT

  size_t size() const { return tensors_.size(); }
  bool empty() const { return tensors_.empty(); }
  // Whether the tensors have names (a map) or not (a list).
  bool named() const { return !names_.empty(); }
  const std::vector<torch::Tensor>& tensors() const { return tensors_; }
  const std::vector<std::string>& names() const { return names_; }

  const torch::Tensor& operator[](size_t i) const;
  torch::Tensor& operator[](size_t i);
  // By name; UserError naming the tensors the bundle has when there is none of that name.
  const torch::Tensor& operator[](const std::string& name) const;
  bool contains(const std::string& name) const;
  // The one tensor of a bundle of one; UserError otherwise, describing the bundle.
  const torch::Tensor& only() const;

  // Appends a tensor: unnamed to a list, named to a map (UserError when mixing the two).
  void push_back(torch::Tensor tensor);
  void add(const std::string& name, torch::Tensor tensor);

  // "hidden" or "#1" (a list's second tensor).
  std::string label(size_t i) const;
  // "hidden float32 [4, 16], mask bool [4, 16]" ("undefined" for an undefined tensor).
  std::string describe() const;
  // The tensors of a map but those named in `names`, in order (a list: itself).
  TensorBundle without(const std::vector<std::string>& names) const;

 private:
  std::vector<torch::Tensor> tensors_;
  std::vector<std::string> names_;  // empty for a list, else one per tensor
};

// torch's Python name of a dtype: "float32", "int64", "bool", "bfloat16", ...
std::string dtype_name(c10::ScalarType dtype);

// Whether a tensor of this dtype carries a gradient back across a cut.
bool carries_gradient(const torch::Tensor& tensor);

// The bundle of gradients a backward message holds for `forward`: for each floating-point
// tensor of `forward`, in order and under its name, its gradient from `grads` (which holds one
// entry per tensor of `forward`, undefined where there is none).
TensorBundle gradient_bundle(const TensorBundle& forward, const std::vector<torch::Tensor>& grads);

// Splits every tensor of `bundle` along dimension 0 into `parts` equal microbatches; UserError
// naming `what` and the tensor when one does not divide.
std::vector<TensorBundle> split_bundle(const TensorBundle& bundle, int parts,
                                       const std::string& what);

// The bytes of a bundle's defined tensors.
int64_t bundle_bytes(const TensorBundle& bundle);

// `bundle` with its defined tensors on `device` (itself when they are there already).
TensorBundle on_device(TensorBundle bundle, const torch::Device& device);

// `bundle` with its tensors of dtype `from` in `to`, the others (integer ids, masks) and those
// of a map named in `keep` as they are: a layer's float32 outputs in a bf16 run's compute dtype
// (runtime/stage.h), and a last stage's output back in float32 for its loss.
TensorBundle with_dtype(TensorBundle bundle, c10::ScalarType from, c10::ScalarType to,
                        const std::vector<std::string>& keep = {});

}  // namespace pptrain
