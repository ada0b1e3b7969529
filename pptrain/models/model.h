// Layer-list models for pipeline training: GPT (character-level), a residual MLP, and a U-Net
// of residual MLP blocks whose encoder sends its states to the decoder past the layers between.
//
// A model is a flat list of layers; a pipeline stage is a consecutive range of them. Each rank
// builds only its own layers with make_layer(options, index); every layer is initialised from
// its own seed, so the same model split 1, 2 or 4 ways starts from identical weights.
//
//   ModelOptions model;                       // gpt, 4 blocks, d_model 64
//   auto ranges = uniform_split(model, 2);    // {{0, 2}, {3, 5}}
//   torch::nn::Sequential stage;
//   for (int i = ranges[0].first; i <= ranges[0].second; ++i) stage->push_back(make_layer(model,
//   i));
//
// Layer lists:
//   gpt: [embedding, block 0 .. block N-1, head]   num_layers = N + 2, num_blocks = N
//        embedding: int64 tokens [mb, T] -> float [mb, T, D] (token + learned position embedding)
//        block:     [mb, T, D] -> [mb, T, D] (pre-norm: LN, causal self-attention, LN, MLP 4D GELU)
//        head:      [mb, T, D] -> logits [mb, T, vocab] (final LayerNorm + LM head)
//   mlp: [block 0 .. block N-1]                   num_layers = N, num_blocks = N
//        block:     float [mb, D] -> [mb, D]: x + W2 gelu(W1 LN(x)), hidden 4D
//        No input/output projection: the synthetic task maps [mb, D] to [mb, D].
//   unet: [down 0 .. down N/2-1, up 0 .. up N/2-1]  num_layers = N (even), num_blocks = N
//        down i:    {h} -> {h: the mlp block of h, skip<i>: the same}; layer 0 takes the [mb, D]
//                   input itself
//        up j:      {h, skip<l>} -> {h: the mlp block of h + skip<l>}, l = N/2 - 1 - j: the
//                   level of the same width, mirrored; skip<l> is used up
//        Layers take and return named bundles (tensor_bundle.h) and pass on the tensors they do
//        not use, so in one stage a skip tensor rides along; a pipeline sends each skip<l> that
//        crosses a cut straight from the stage of down l to the stage of up (N/2-1-l)
//        (layer_skips(), PipelineOptions::skips). The synthetic task of the mlp.
// Every matrix product is a PipeLinear (pipe_linear.h), so its weight gradient can be deferred.
// No dropout: runs are deterministic.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pptrain {

struct ModelOptions {
  std::string kind = "gpt";  // "gpt", "mlp" or "unet"
  int layers = 4;            // transformer / residual MLP blocks
  int d_model = 64;
  int heads = 4;         // gpt only
  int seq_len = 32;      // gpt: tokens per sample; mlp: ignored
  int vocab_size = 256;  // gpt: byte-level characters
  uint64_t seed = 0;
  // gpt: the head's output weight starts as a copy of the embedding's token table [vocab, D],
  // and training keeps the two equal (tied_parameters(), PipelineOptions::tied).
  bool tie_embeddings = false;
};

// UserError on bad values (unknown kind, layers < 1, d_model % heads != 0, ...).
void check_options(const ModelOptions& options);

// Length of the layer list (gpt: layers + 2; mlp: layers).
int num_layers(const ModelOptions& options);

// Number of transformer / MLP blocks: what "more stages than layers" compares against.
int num_blocks(const ModelOptions& options);

// Whether the model learns the synthetic map [mb, D] -> [mb, D] (mlp, unet), not text (gpt).
bool is_regression(const ModelOptions& options);

// Whether layer `index` takes and returns a TensorBundle (unet) rather than one tensor.
bool layer_takes_bundle(const ModelOptions& options, int index);

// A tensor one layer outputs for a later layer, not the next (unet's skip<l>): the name, the
// layer that makes it and the layer that uses it. A pipeline sends it straight to the stage of
// `to_layer` when the two are on different stages.
struct LayerSkip {
  std::string name;
  int from_layer = 0;
  int to_layer = 0;
};
std::vector<LayerSkip> layer_skips(const ModelOptions& options);

// "embedding", "block3", "head" (gpt); "block3" (mlp); "down1", "up0" (unet).
std::string layer_name(const ModelOptions& options, int index);

// The tensors of layer `layer` (a module make_layer() built) that are copies of a tensor shared
// with another layer, by the shared tensor's name: with tie_embeddings, "embedding" is the
// embedding's token table and the head's output weight; nothing otherwise.
std::vector<std::pair<std::string, torch::Tensor>> tied_parameters(const ModelOptions& options,
                                                                   int layer,
                                                                   const torch::nn::Module& module);

// Builds layer `index` of the list, initialised from seed * 1000003 + index. Independent of
// which other layers this process builds and of the global RNG state (which it leaves as found).
torch::nn::AnyModule make_layer(const ModelOptions& options, int index);

// Default split of the layer list into `stages` consecutive ranges [first, last] (inclusive),
// balancing blocks: the gpt embedding goes with the first stage, the head with the last.
// UserError if stages < 1 or stages > num_blocks.
std::vector<std::pair<int, int>> uniform_split(const ModelOptions& options, int stages);

// Loss of the last stage's output against the targets, a mean over the microbatch's elements:
// gpt: cross-entropy of logits [mb, T, vocab] vs int64 targets [mb, T];
// mlp, unet: mean squared error of [mb, D] vs [mb, D].
torch::Tensor compute_loss(const ModelOptions& options, const torch::Tensor& output,
                           const torch::Tensor& target);

// Shape of the input layer `index` receives for a microbatch of `microbatch_size` samples, and
// its dtype: gpt embedding takes int64 [mb, T]; the others float [mb, T, D] (gpt) or [mb, D]
// (mlp; unet's hidden states, beside the skip tensors it carries).
std::vector<int64_t> layer_input_shape(const ModelOptions& options, int index,
                                       int64_t microbatch_size);
torch::Dtype layer_input_dtype(const ModelOptions& options, int index);

// Shape of what layer `index` outputs (what a cut after it sends), always float.
std::vector<int64_t> layer_output_shape(const ModelOptions& options, int index,
                                        int64_t microbatch_size);

}  // namespace pptrain
