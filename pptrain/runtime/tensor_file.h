// A file of named tensors, in torch's archive format: what a run holds in flight between two
// steps of an asynchronous schedule (weight versions, microbatches, messages), for a checkpoint.
//
//   NamedTensors state{{"stage1/live_version", torch::tensor(3)}};
//   write_archive_file(archive_of("in_flight_rank0.pt", state, /*copy=*/false), dir);
//   NamedTensors back = read_tensor_file(dir + "/in_flight_rank0.pt", "--resume");
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pptrain/runtime/archive_file.h"
#include "pptrain/runtime/stage.h"

namespace pptrain {

// NamedTensors and the file's writing: runtime/archive_file.h.
// UserError starting with `flag` and naming the file when it is missing or unreadable.
NamedTensors read_tensor_file(const std::string& path, const std::string& flag);

// The tensor `name` of `tensors`; UserError starting with `flag` when it is not there.
const torch::Tensor& tensor_named(const NamedTensors& tensors, const std::string& name,
                                  const std::string& flag);
// A whole number kept as a one-element int64 tensor, and back.
torch::Tensor number_tensor(int64_t value);
int64_t number_of(const NamedTensors& tensors, const std::string& name, const std::string& flag);

// A list of tensors under `prefix` ("<prefix><i>", and "<prefix>count"), and back (a copy of
// each, so that the state read owns its memory).
void put_tensors(const std::string& prefix, const std::vector<torch::Tensor>& tensors,
                 NamedTensors& out);
std::vector<torch::Tensor> take_tensors(const std::string& prefix, const NamedTensors& in,
                                        const std::string& flag);
// A bundle (models/tensor_bundle.h) under `prefix`: its tensors named `<prefix>/<i>` (a list)
// or `<prefix>/<i>:<name>` (a map), undefined ones left out; and back (an empty bundle when
// nothing is under `prefix`).
void put_bundle(const std::string& prefix, const TensorBundle& bundle, NamedTensors& out);
TensorBundle take_bundle(const std::string& prefix, const NamedTensors& in);
// A stage's parameters and their gradients under `prefix`, and back into a stage of the same
// layers (in place, so graphs and optimizers that hold the tensors see the values). UserError
// starting with `flag` when the shapes differ.
void put_weights(const std::string& prefix, const Stage& stage, NamedTensors& out);
void take_weights(const std::string& prefix, const NamedTensors& in, Stage& stage,
                  const std::string& flag);
// The gradients alone (undefined ones as zeros), and back.
void put_gradients(const std::string& prefix, const Stage& stage, NamedTensors& out);
void take_gradients(const std::string& prefix, const NamedTensors& in, Stage& stage,
                    const std::string& flag);

}  // namespace pptrain
