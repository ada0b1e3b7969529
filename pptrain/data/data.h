// Training data: character-level text for gpt, a synthetic teacher for mlp.
//
//   Dataset data(model_options, DataOptions{});      // GPL-3 text from /usr/share/common-licenses
//   auto batch = data.batch(step);                   // same on every rank for (seed, step)
//   auto inputs = Dataset::split(batch.inputs, 4);   // 4 microbatches along dim 0
//
// Only the first stage reads inputs and only the last reads targets; both call batch(step).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pptrain/models/model.h"

namespace pptrain {

struct DataOptions {
  // "default": /usr/share/common-licenses/GPL-3 (or another file in that folder);
  // "synthetic": synthetic data (the only choice for mlp, which also takes "default");
  // anything else: path to a text file.
  std::string source = "default";
  int batch_size = 8;    // samples per step, over all microbatches
  int microbatches = 1;  // batch_size must divide evenly by this
  uint64_t seed = 0;
  // gpt: 0 for samples of the model's seq_len tokens; else each step's batch has its own
  // length, drawn from [min_seq_len, seq_len] by (seed, step) (--seq-len-range MIN:MAX).
  int64_t min_seq_len = 0;
};

class Dataset {
 public:
  // UserError if the file is unreadable or shorter than seq_len + 1 bytes, if batch_size is
  // not a positive multiple of microbatches, or if min_seq_len is not in 0 .. seq_len.
  Dataset(const ModelOptions& model, const DataOptions& data);

  struct Batch {
    torch::Tensor inputs;   // gpt: int64 [N, T] byte values (T: see min_seq_len); mlp: float [N, D]
    torch::Tensor targets;  // gpt: int64 [N, T] = inputs shifted by one char; mlp: float [N, D]
  };
  // Deterministic for (seed, step): the same on every rank.
  Batch batch(int step) const;

  // Splits along dim 0 into `microbatches` equal parts; UserError if N % microbatches != 0.
  static std::vector<torch::Tensor> split(const torch::Tensor& t, int microbatches);

  // Text source actually read (empty for synthetic data) and its length in bytes.
  const std::string& path() const { return path_; }
  int64_t text_bytes() const { return text_.defined() ? text_.numel() : 0; }

 private:
  ModelOptions model_;
  DataOptions data_;
  std::string path_;
  torch::Tensor text_;     // gpt: int64 [bytes]
  torch::Tensor teacher_;  // mlp: float [D, D], y = tanh(x A)
};

}  // namespace pptrain
