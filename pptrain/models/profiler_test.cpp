#include "pptrain/models/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

ProfileOptions tiny(const std::string& kind) {
  ProfileOptions options;
  options.model.kind = kind;
  options.model.layers = 2;
  options.model.d_model = 16;
  options.model.heads = 2;
  options.model.seq_len = 8;
  options.microbatch_size = 2;
  options.warmup = 1;
  options.iters = 3;
  return options;
}

TEST(Profiler, MeasuresEveryLayerOfGpt) {
  ModelProfile profile = profile_model(tiny("gpt"));
  ASSERT_EQ(profile.layers.size(), 4u);
  EXPECT_EQ(profile.layers[0].name, "embedding");
  EXPECT_EQ(profile.layers[3].name, "head");
  EXPECT_EQ(profile.threads, 1);
  const int64_t d = 16, t = 8, mb = 2, v = 256;
  EXPECT_EQ(profile.layers[0].activation_bytes, mb * t * d * 4);
  EXPECT_EQ(profile.layers[3].activation_bytes, mb * t * v * 4);
  EXPECT_EQ(profile.layers[0].parameter_bytes, (v * d + t * d) * 4);
  // Block: two LayerNorms (2D each), then qkv, proj, fc1 and fc2 with biases.
  const int64_t block_params =
      2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  EXPECT_EQ(profile.layers[1].parameter_bytes, block_params * 4);
  for (const LayerProfile& layer : profile.layers) {
    EXPECT_GT(layer.forward_ms, 0) << layer.name;
    EXPECT_GT(layer.backward_input_ms, 0) << layer.name;
    EXPECT_GE(layer.backward_weight_ms, 0) << layer.name;
  }
  // A block keeps its LayerNorm outputs, q/k/v, attention weights and MLP hidden layer: far more
  // than its output.
  EXPECT_GT(profile.layers[1].stash_bytes, 2 * profile.layers[1].activation_bytes);
  // W keeps most of it after I: its linear layers' inputs (far more than the paper's half).
  EXPECT_GT(profile.layers[1].weight_stash_bytes, 0.5 * profile.layers[1].stash_bytes);
  EXPECT_LE(profile.layers[1].weight_stash_bytes, profile.layers[1].stash_bytes);
  // A block's backward makes gradients of its intermediates on the way.
  EXPECT_GT(profile.layers[1].backward_transient_bytes, 0);
  // Of each, what does not grow with the samples is a part of it.
  for (const LayerProfile& layer : profile.layers) {
    EXPECT_GE(layer.stash_fixed_bytes, 0) << layer.name;
    EXPECT_LE(layer.stash_fixed_bytes, layer.stash_bytes) << layer.name;
    EXPECT_LE(layer.forward_transient_fixed_bytes, layer.forward_transient_bytes) << layer.name;
    EXPECT_LE(layer.backward_transient_fixed_bytes, layer.backward_transient_bytes) << layer.name;
  }
  EXPECT_EQ(profile.input_bytes, mb * t * 8);  // int64 token ids
  EXPECT_EQ(profile.target_bytes, mb * t * 8);
}

TEST(Profiler, WritesTheProfileFormat) {
  ModelProfile profile = profile_model(tiny("mlp"));
  const std::string path =
      testing::TempDir() + "pptrain_profiler_test_" + std::to_string(::getpid()) + ".json";
  write_profile_json(profile, path);
  std::ifstream in(path);
  nlohmann::json json = nlohmann::json::parse(in);
  std::remove(path.c_str());
  EXPECT_EQ(json["format"], "pptrain-profile-1");
  EXPECT_EQ(json["model"]["kind"], "mlp");
  EXPECT_EQ(json["model"]["d_model"], 16);
  EXPECT_EQ(json["settings"]["microbatch_size"], 2);
  EXPECT_EQ(json["settings"]["threads"], 1);
  EXPECT_TRUE(json["machine"]["torch_version"].is_string());
  ASSERT_EQ(json["layers"].size(), 2u);
  for (const char* field :
       {"name", "forward_ms", "backward_input_ms", "backward_weight_ms", "activation_bytes",
        "stash_bytes", "parameter_bytes", "weight_stash_bytes", "forward_transient_bytes",
        "backward_transient_bytes", "stash_fixed_bytes", "forward_transient_fixed_bytes",
        "backward_transient_fixed_bytes"}) {
    EXPECT_TRUE(json["layers"][1].contains(field)) << field;
  }
  EXPECT_EQ(json["layers"][1]["activation_bytes"], 2 * 16 * 4);
  EXPECT_EQ(json["batch"]["input_bytes"], 2 * 16 * 4);  // [mb, D] floats in, and as targets
  EXPECT_EQ(json["batch"]["target_bytes"], 2 * 16 * 4);
}

// At bf16 a block's forward casts its weights for its products, once per microbatch whatever
// its samples: most of its working memory at a small microbatch does not grow with them, and
// the profile says so; at one sample there is no second size to tell, and nothing is fixed.
TEST(Profiler, FindsWhatDoesNotGrowWithTheSamples) {
  ProfileOptions options = tiny("gpt");
  options.precision = Precision::kBf16;
  const LayerProfile block = profile_model(options).layers[1];
  EXPECT_GT(block.forward_transient_fixed_bytes, 0.5 * block.forward_transient_bytes);
  options.microbatch_size = 1;
  const LayerProfile one = profile_model(options).layers[1];
  EXPECT_EQ(one.stash_fixed_bytes, 0);
  EXPECT_EQ(one.forward_transient_fixed_bytes, 0);
  EXPECT_EQ(one.backward_transient_fixed_bytes, 0);
}

TEST(Profiler, RejectsBadOptions) {
  ProfileOptions options = tiny("mlp");
  options.iters = 0;
  EXPECT_THROW(profile_model(options), UserError);
  options = tiny("gpt");
  options.model.heads = 3;
  EXPECT_THROW(profile_model(options), UserError);
  EXPECT_THROW(write_profile_json(profile_model(tiny("mlp")), "/nonexistent/dir/p.json"),
               UserError);
}

}  // namespace
}  // namespace pptrain
