#include "pptrain/models/model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

ModelOptions tiny_gpt() {
  ModelOptions options;
  options.layers = 3;
  options.d_model = 16;
  options.heads = 2;
  options.seq_len = 8;
  options.seed = 7;
  return options;
}

ModelOptions tiny_mlp() {
  ModelOptions options;
  options.kind = "mlp";
  options.layers = 3;
  options.d_model = 8;
  return options;
}

torch::nn::Sequential build(const ModelOptions& options, int first, int last) {
  torch::nn::Sequential stage;
  for (int i = first; i <= last; ++i) stage->push_back(make_layer(options, i));
  return stage;
}

TEST(Model, LayerListShape) {
  ModelOptions gpt = tiny_gpt();
  EXPECT_EQ(num_layers(gpt), 5);
  EXPECT_EQ(num_blocks(gpt), 3);
  EXPECT_EQ(layer_name(gpt, 0), "embedding");
  EXPECT_EQ(layer_name(gpt, 1), "block0");
  EXPECT_EQ(layer_name(gpt, 4), "head");
  EXPECT_THROW(layer_name(gpt, 5), UserError);
  ModelOptions mlp = tiny_mlp();
  EXPECT_EQ(num_layers(mlp), 3);
  EXPECT_EQ(num_blocks(mlp), 3);
  EXPECT_EQ(layer_name(mlp, 2), "block2");
}

TEST(Model, OutputShapesMatchDeclaredShapes) {
  for (const ModelOptions& options : {tiny_gpt(), tiny_mlp()}) {
    torch::Tensor x = layer_input_dtype(options, 0) == torch::kInt64
                          ? torch::randint(0, 256, layer_input_shape(options, 0, 3), torch::kInt64)
                          : torch::randn(layer_input_shape(options, 0, 3));
    for (int i = 0; i < num_layers(options); ++i) {
      EXPECT_EQ(x.sizes(), torch::IntArrayRef(layer_input_shape(options, i, 3))) << i;
      x = make_layer(options, i).forward(x);
      EXPECT_EQ(x.sizes(), torch::IntArrayRef(layer_output_shape(options, i, 3))) << i;
    }
  }
}

TEST(Model, UniformSplitBalancesBlocks) {
  ModelOptions gpt = tiny_gpt();
  gpt.layers = 4;  // layers: embedding, block0..3 (1..4), head (5)
  using Ranges = std::vector<std::pair<int, int>>;
  EXPECT_EQ(uniform_split(gpt, 1), (Ranges{{0, 5}}));
  EXPECT_EQ(uniform_split(gpt, 2), (Ranges{{0, 2}, {3, 5}}));
  EXPECT_EQ(uniform_split(gpt, 4), (Ranges{{0, 1}, {2, 2}, {3, 3}, {4, 5}}));
  // The spare block goes to the middle stage, not to the ones with the embedding or head.
  EXPECT_EQ(uniform_split(gpt, 3), (Ranges{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_THROW(uniform_split(gpt, 5), UserError);
  EXPECT_THROW(uniform_split(gpt, 0), UserError);
  ModelOptions mlp = tiny_mlp();
  EXPECT_EQ(uniform_split(mlp, 2), (Ranges{{0, 1}, {2, 2}}));
}

TEST(Model, LayersAreSeededIndependently) {
  ModelOptions options = tiny_gpt();
  torch::manual_seed(123);
  auto a = make_layer(options, 2);
  auto after_a = torch::rand({4});  // the global generator is left as found
  torch::manual_seed(123);
  auto expected = torch::rand({4});
  EXPECT_TRUE(torch::equal(after_a, expected));

  make_layer(options, 1);  // building other layers first must not matter
  auto b = make_layer(options, 2);
  auto pa = a.ptr()->parameters(), pb = b.ptr()->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));

  auto c = make_layer(options, 3);  // another block, another seed
  EXPECT_FALSE(torch::equal(c.ptr()->parameters()[2], pa[2]));
  options.seed += 1;
  auto d = make_layer(options, 2);
  EXPECT_FALSE(torch::equal(d.ptr()->parameters()[2], pa[2]));
}

TEST(Model, SplitsComputeTheSameFunction) {
  ModelOptions options = tiny_gpt();
  auto tokens = torch::randint(0, 256, {2, 8}, torch::kInt64);
  auto whole = build(options, 0, 4)->forward(tokens);
  // Build the second stage first: the order a process builds layers in must not matter.
  auto second = build(options, 3, 4);
  auto first = build(options, 0, 2);
  auto split = second->forward(first->forward(tokens));
  EXPECT_TRUE(torch::equal(whole, split));
}

TEST(Model, GptIsCausal) {
  ModelOptions options = tiny_gpt();
  auto model = build(options, 0, num_layers(options) - 1);
  auto tokens = torch::randint(0, 256, {1, 8}, torch::kInt64);
  auto changed = tokens.clone();
  changed[0][5] = (changed[0][5].item<int64_t>() + 1) % 256;
  auto a = model->forward(tokens), b = model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.slice(1, 0, 5), b.slice(1, 0, 5), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(a.slice(1, 5, 8), b.slice(1, 5, 8), 1e-6, 1e-6));
}

TEST(Model, InitialGptLossIsNearUniform) {
  ModelOptions options = tiny_gpt();
  auto model = build(options, 0, num_layers(options) - 1);
  auto tokens = torch::randint(0, 256, {4, 8}, torch::kInt64);
  double loss = compute_loss(options, model->forward(tokens), tokens).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.7);
}

TEST(Model, RejectsBadOptions) {
  ModelOptions options = tiny_gpt();
  options.heads = 3;
  EXPECT_THROW(check_options(options), UserError);
  options = tiny_gpt();
  options.layers = 0;
  EXPECT_THROW(check_options(options), UserError);
  options = tiny_gpt();
  options.kind = "cnn";
  try {
    check_options(options);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'cnn'"), std::string::npos);
  }
}

}  // namespace
}  // namespace pptrain
