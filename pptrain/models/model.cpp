#include "pptrain/models/model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "pptrain/common/check.h"
#include "pptrain/models/pipe_linear.h"
#include "pptrain/models/tensor_bundle.h"

namespace pptrain {
namespace {

bool is_gpt(const ModelOptions& options) {
  return options.kind == "gpt";
}

bool is_unet(const ModelOptions& options) {
  return options.kind == "unet";
}

// Seeds torch's default CPU generator for the lifetime of the object and then restores it, so a
// layer's initial weights depend only on its own seed, not on what was built before it.
class ScopedSeed {
 public:
  explicit ScopedSeed(uint64_t seed) : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_state_ = generator_.get_state();
    generator_.set_current_seed(seed);
  }
  ~ScopedSeed() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_state_);
  }
  ScopedSeed(const ScopedSeed&) = delete;
  ScopedSeed& operator=(const ScopedSeed&) = delete;

 private:
  at::Generator generator_;
  torch::Tensor saved_state_;
};

// x + W2 gelu(W1 LN(x)) with hidden width 4D: the MLP half of a transformer block, and the
// whole of an mlp-model block. x [..., D] -> [..., D].
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(int64_t d_model)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        fc1(register_module("fc1", PipeLinear(d_model, 4 * d_model))),
        fc2(register_module("fc2", PipeLinear(4 * d_model, d_model))) {}

  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(norm(x)))); }

  torch::nn::LayerNorm norm;
  PipeLinear fc1, fc2;
};
TORCH_MODULE(FeedForward);

// x + proj(causal multi-head self-attention(LN(x))). x [mb, T, D] -> [mb, T, D].
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d_model, int64_t heads)
      : heads(heads),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        qkv(register_module("qkv", PipeLinear(d_model, 3 * d_model))),
        proj(register_module("proj", PipeLinear(d_model, d_model))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0), tokens = x.size(1), d_model = x.size(2);
    const int64_t head_dim = d_model / heads;
    // [mb, T, 3D] -> three [mb, H, T, head_dim]
    auto parts = qkv(norm(x)).view({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
    auto q = parts[0], k = parts[1], v = parts[2];
    auto scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    // [T, T], true = masked; on the activations' device
    auto future = torch::ones({tokens, tokens}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    auto mixed = torch::softmax(scores, -1).matmul(v);  // [mb, H, T, head_dim]
    return x + proj(mixed.transpose(1, 2).reshape({batch, tokens, d_model}));
  }

  int64_t heads;
  torch::nn::LayerNorm norm;
  PipeLinear qkv, proj;
};
TORCH_MODULE(Attention);

// Pre-norm transformer block. [mb, T, D] -> [mb, T, D].
struct TransformerBlockImpl : torch::nn::Module {
  TransformerBlockImpl(int64_t d_model, int64_t heads)
      : attention(register_module("attention", Attention(d_model, heads))),
        feed_forward(register_module("feed_forward", FeedForward(d_model))) {}

  torch::Tensor forward(const torch::Tensor& x) { return feed_forward(attention(x)); }

  Attention attention;
  FeedForward feed_forward;
};
TORCH_MODULE(TransformerBlock);

// Token plus learned position embedding. The lookups compute their weight gradients during I
// (no deferral: they are scatter-adds, not matrix products). int64 [mb, T] -> [mb, T, D].
struct EmbeddingImpl : torch::nn::Module {
  EmbeddingImpl(int64_t vocab_size, int64_t seq_len, int64_t d_model) {
    // GPT-2's scale: small, so the first LayerNorm rather than the embedding sets the scale.
    token = register_parameter("token", torch::randn({vocab_size, d_model}) * 0.02);
    position = register_parameter("position", torch::randn({seq_len, d_model}) * 0.02);
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    PPTRAIN_CHECK(tokens.dim() == 2 && tokens.size(1) <= position.size(0),
                  "embedding expects tokens [microbatch, <= ", position.size(0), "], got ",
                  tokens.sizes());
    return torch::embedding(token, tokens) + position.slice(0, 0, tokens.size(1));
  }

  torch::Tensor token;     // [vocab, D]
  torch::Tensor position;  // [T, D]
};
TORCH_MODULE(Embedding);

// Final LayerNorm and LM head. [mb, T, D] -> logits [mb, T, vocab].
struct HeadImpl : torch::nn::Module {
  HeadImpl(int64_t d_model, int64_t vocab_size)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        lm_head(register_module("lm_head", PipeLinear(d_model, vocab_size))) {}

  torch::Tensor forward(const torch::Tensor& x) { return lm_head(norm(x)); }

  torch::nn::LayerNorm norm;
  PipeLinear lm_head;
};
TORCH_MODULE(Head);

// unet's tensor of level l: what down l sends up (N/2 - 1 - l).
std::string skip_name(int level) {
  return "skip" + std::to_string(level);
}

// unet's encoder layer `level`: the mlp block on h, whose result also goes to the decoder.
struct UnetDownImpl : torch::nn::Module {
  UnetDownImpl(int64_t d_model, int level)
      : level(level), block(register_module("block", FeedForward(d_model))) {}

  TensorBundle forward(const TensorBundle& in) {
    // Layer 0 takes the batch's input, a bundle of one unnamed tensor.
    const bool first = !in.named();
    const torch::Tensor h = block(first ? in.only() : in["h"]);
    TensorBundle out = first ? TensorBundle() : in.without({"h"});
    out.add("h", h);
    out.add(skip_name(level), h);
    return out;
  }

  int level;
  FeedForward block;
};
TORCH_MODULE(UnetDown);

// unet's decoder layer for `level`: the mlp block on h plus what the encoder sent at that level.
struct UnetUpImpl : torch::nn::Module {
  UnetUpImpl(int64_t d_model, int level)
      : level(level), block(register_module("block", FeedForward(d_model))) {}

  TensorBundle forward(const TensorBundle& in) {
    const std::string skip = skip_name(level);
    TensorBundle out = in.without({"h", skip});
    out.add("h", block(0.5 * (in["h"] + in[skip])));  // the mean keeps the scale
    return out;
  }

  int level;
  FeedForward block;
};
TORCH_MODULE(UnetUp);

void check_layer_index(const ModelOptions& options, int index) {
  PPTRAIN_CHECK(index >= 0 && index < num_layers(options), "layer index ", index,
                " out of range: the ", options.kind, " model has ", num_layers(options), " layers");
}

}  // namespace

void check_options(const ModelOptions& options) {
  PPTRAIN_CHECK(options.kind == "gpt" || options.kind == "mlp" || options.kind == "unet",
                "model kind must be gpt, mlp or unet, got '", options.kind, "'");
  PPTRAIN_CHECK(options.layers >= 1, "--layers must be >= 1, got ", options.layers);
  PPTRAIN_CHECK(options.d_model >= 1, "--d-model must be >= 1, got ", options.d_model);
  PPTRAIN_CHECK(!is_unet(options) || options.layers % 2 == 0,
                "--model unet needs an even number of --layers (down and up blocks), got ",
                options.layers);
  PPTRAIN_CHECK(!options.tie_embeddings || is_gpt(options),
                "--tie-embeddings applies to --model gpt only");
  if (is_gpt(options)) {
    PPTRAIN_CHECK(options.heads >= 1, "--heads must be >= 1, got ", options.heads);
    PPTRAIN_CHECK(options.d_model % options.heads == 0, "--d-model (", options.d_model,
                  ") must be divisible by --heads (", options.heads, ")");
    PPTRAIN_CHECK(options.seq_len >= 1, "--seq-len must be >= 1, got ", options.seq_len);
    PPTRAIN_CHECK(options.vocab_size >= 2, "vocab size must be >= 2, got ", options.vocab_size);
  }
}

int num_blocks(const ModelOptions& options) {
  return options.layers;
}

bool is_regression(const ModelOptions& options) {
  return !is_gpt(options);
}

bool layer_takes_bundle(const ModelOptions& options, int index) {
  check_layer_index(options, index);
  return is_unet(options);
}

std::vector<LayerSkip> layer_skips(const ModelOptions& options) {
  if (!is_unet(options)) return {};
  std::vector<LayerSkip> out;
  for (int level = 0; level < options.layers / 2; ++level)
    out.push_back({skip_name(level), level, options.layers - 1 - level});
  return out;
}

int num_layers(const ModelOptions& options) {
  return is_gpt(options) ? options.layers + 2 : options.layers;
}

std::string layer_name(const ModelOptions& options, int index) {
  check_layer_index(options, index);
  if (is_unet(options)) {
    const int half = options.layers / 2;
    return index < half ? "down" + std::to_string(index) : "up" + std::to_string(index - half);
  }
  if (!is_gpt(options)) return "block" + std::to_string(index);
  if (index == 0) return "embedding";
  if (index == num_layers(options) - 1) return "head";
  return "block" + std::to_string(index - 1);
}

torch::nn::AnyModule make_layer(const ModelOptions& options, int index) {
  check_options(options);
  check_layer_index(options, index);
  // 1000003 is prime, so (seed, index) pairs of any realistic size never collide.
  ScopedSeed seed(options.seed * 1000003ULL + static_cast<uint64_t>(index));
  const int64_t d_model = options.d_model;
  if (is_unet(options)) {
    const int half = options.layers / 2;
    if (index < half) return torch::nn::AnyModule(UnetDown(d_model, index));
    return torch::nn::AnyModule(UnetUp(d_model, options.layers - 1 - index));
  }
  if (!is_gpt(options)) return torch::nn::AnyModule(FeedForward(d_model));
  if (index == 0) {
    return torch::nn::AnyModule(Embedding(options.vocab_size, options.seq_len, d_model));
  }
  if (index == num_layers(options) - 1) {
    Head head(d_model, options.vocab_size);
    if (options.tie_embeddings) {
      // The token table as layer 0 draws it, from layer 0's seed.
      ScopedSeed embedding_seed(options.seed * 1000003ULL);
      Embedding embedding(options.vocab_size, options.seq_len, d_model);
      torch::NoGradGuard no_grad;
      head->lm_head->weight.copy_(embedding->token);
    }
    return torch::nn::AnyModule(head);
  }
  return torch::nn::AnyModule(TransformerBlock(d_model, options.heads));
}

std::vector<std::pair<std::string, torch::Tensor>> tied_parameters(
    const ModelOptions& options, int layer, const torch::nn::Module& module) {
  check_layer_index(options, layer);
  if (!is_gpt(options) || !options.tie_embeddings) return {};
  const auto params = module.named_parameters();
  if (layer == 0) return {{"embedding", params["token"]}};
  if (layer == num_layers(options) - 1) return {{"embedding", params["lm_head.weight"]}};
  return {};
}

std::vector<std::pair<int, int>> uniform_split(const ModelOptions& options, int stages) {
  check_options(options);
  const int blocks = num_blocks(options);
  PPTRAIN_CHECK(stages >= 1 && stages <= blocks, "number of stages must be between 1 and the ",
                "number of blocks (", blocks, "), got ", stages);
  // Blocks per stage: equal shares, the remainder one each to the stages that do not also hold
  // the gpt embedding or head (the middle ones first), so the extra layers balance out.
  std::vector<int> counts(stages, blocks / stages);
  std::vector<int> order;
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  if (!is_gpt(options)) {
    order.clear();
    for (int s = 0; s < stages; ++s) order.push_back(s);
  }
  for (int i = 0; i < blocks % stages; ++i) counts[order[i]] += 1;

  const int offset = is_gpt(options) ? 1 : 0;  // layer index of block 0
  std::vector<std::pair<int, int>> ranges;
  int next_block = 0;
  for (int s = 0; s < stages; ++s) {
    int first = offset + next_block;
    next_block += counts[s];
    int last = offset + next_block - 1;
    if (s == 0) first = 0;
    if (s == stages - 1) last = num_layers(options) - 1;
    ranges.emplace_back(first, last);
  }
  return ranges;
}

torch::Tensor compute_loss(const ModelOptions& options, const torch::Tensor& output,
                           const torch::Tensor& target) {
  if (is_gpt(options)) {
    PPTRAIN_ASSERT(output.dim() == 3 && target.dim() == 2, "gpt loss expects logits [mb, T, V]",
                   " and targets [mb, T]");
    return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}),
                                                target.reshape({-1}));
  }
  PPTRAIN_ASSERT(output.sizes() == target.sizes(), "mlp loss expects equal shapes");
  return torch::mse_loss(output, target);
}

std::vector<int64_t> layer_input_shape(const ModelOptions& options, int index,
                                       int64_t microbatch_size) {
  check_layer_index(options, index);
  if (!is_gpt(options)) return {microbatch_size, options.d_model};
  if (index == 0) return {microbatch_size, options.seq_len};
  return {microbatch_size, options.seq_len, options.d_model};
}

torch::Dtype layer_input_dtype(const ModelOptions& options, int index) {
  check_layer_index(options, index);
  return is_gpt(options) && index == 0 ? torch::kInt64 : torch::kFloat32;
}

std::vector<int64_t> layer_output_shape(const ModelOptions& options, int index,
                                        int64_t microbatch_size) {
  check_layer_index(options, index);
  if (!is_gpt(options)) return {microbatch_size, options.d_model};
  if (index == num_layers(options) - 1) {
    return {microbatch_size, options.seq_len, options.vocab_size};
  }
  return {microbatch_size, options.seq_len, options.d_model};
}

}  // namespace pptrain
