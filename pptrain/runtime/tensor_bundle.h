// What crosses a cut between two stages: a bundle of tensors, and how it travels.
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
// use the tensor).
//
// On the wire (send_bundle / BundleReceive) a message is one buffer of bytes: a header (each
// tensor's name, dtype and shape, and the message's length) and the tensors' bytes. The
// receiver posts its receive ahead, sized as the last message of the same tag was, so that a
// message of the same length as before (the usual case: the same shapes every step) arrives as
// it is sent, in one transfer. When the length changed (the first message of a tag, a batch of
// another sequence length) the sender first sends a notice of the old length that tells the new
// one, and then the message: one round trip more, and no probe or declaration of shapes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pptrain/runtime/transport.h"

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

// The length of the last message of each tag, as its sender and its receiver saw it: both
// ends of a tag's messages remember the same sequence of lengths, which is what lets a receive
// be sized before its message comes. One per Executor, kept from step to step; a tag's next
// message may be sent or received only once its last one has been received.
struct MessageLengths {
  std::unordered_map<int, int64_t> sent;
  std::unordered_map<int, int64_t> received;
};

// Sends `bundle` as the message of `tag` to `peer` (its tensors copied into the message, so
// they may change at once). The result completes when the message is out; it adds the
// tensors' bytes (not the header's) to `bytes_sent`.
PendingComm send_bundle(Transport& transport, const TensorBundle& bundle, int peer, int tag,
                        MessageLengths& lengths, int64_t* bytes_sent = nullptr);

// A message on its way in, its receive posted when made (ahead of the RECV that takes it).
class BundleReceive {
 public:
  BundleReceive() = default;
  // `what` names the message in errors ("the output of stage 1 to stage 2 (microbatch 3)");
  // `lengths` outlives the receive.
  BundleReceive(Transport& transport, int peer, int tag, std::string what, MessageLengths& lengths);

  // Waits for the message (and its second part after a notice of a new length); the tensors
  // it holds, of the names, dtypes and shapes its header tells. Rethrows what went wrong (a
  // timeout, a broken connection); UserError naming the message when it is not one of ours.
  TensorBundle finish();

 private:
  Transport* transport_ = nullptr;
  int peer_ = -1;
  int tag_ = -1;
  std::string what_;
  MessageLengths* lengths_ = nullptr;
  PendingComm first_;
};

}  // namespace pptrain
