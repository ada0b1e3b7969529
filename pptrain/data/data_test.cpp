#include "pptrain/data/data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "pptrain/common/check.h"
#include "pptrain/models/model.h"

namespace pptrain {
namespace {

ModelOptions gpt(int seq_len = 32) {
  ModelOptions options;
  options.seq_len = seq_len;
  return options;
}

TEST(Dataset, DefaultTextGivesShiftedByteWindows) {
  DataOptions options;
  Dataset data(gpt(), options);
  EXPECT_EQ(data.path(), "/usr/share/common-licenses/GPL-3");
  EXPECT_GT(data.text_bytes(), 30000);
  auto batch = data.batch(0);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(batch.inputs.slice(1, 1, 32), batch.targets.slice(1, 0, 31)));
  EXPECT_GE(batch.inputs.min().item<int64_t>(), 0);
  EXPECT_LT(batch.inputs.max().item<int64_t>(), 256);
  // English text: mostly lower-case letters and spaces.
  auto letters = ((batch.inputs >= 'a') & (batch.inputs <= 'z')).sum().item<int64_t>();
  EXPECT_GT(letters, batch.inputs.numel() / 2);
}

TEST(Dataset, BatchesAreDeterministicPerSeedAndStep) {
  DataOptions options;
  Dataset a(gpt(), options), b(gpt(), options);
  EXPECT_TRUE(torch::equal(a.batch(3).inputs, b.batch(3).inputs));
  EXPECT_FALSE(torch::equal(a.batch(3).inputs, a.batch(4).inputs));
  options.seed = 1;
  Dataset c(gpt(), options);
  EXPECT_FALSE(torch::equal(a.batch(3).inputs, c.batch(3).inputs));
  // Unaffected by torch's global generator.
  torch::manual_seed(99);
  auto first = a.batch(5).inputs;
  torch::manual_seed(100);
  EXPECT_TRUE(torch::equal(first, a.batch(5).inputs));
}

TEST(Dataset, SyntheticData) {
  DataOptions options;
  options.source = "synthetic";
  auto batch = Dataset(gpt(16), options).batch(0);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_TRUE(torch::equal(batch.inputs.slice(1, 1, 16), batch.targets.slice(1, 0, 15)));

  ModelOptions mlp;
  mlp.kind = "mlp";
  mlp.d_model = 12;
  Dataset data(mlp, options);
  auto regression = data.batch(2);
  EXPECT_EQ(regression.inputs.sizes(), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(regression.targets.sizes(), (std::vector<int64_t>{8, 12}));
  EXPECT_LT(regression.targets.abs().max().item<double>(), 1.0);
  EXPECT_TRUE(torch::equal(regression.targets, data.batch(2).targets));
}

TEST(Dataset, SplitAlongTheBatch) {
  auto t = torch::arange(24).view({8, 3});
  auto parts = Dataset::split(t, 4);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[1].sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(torch::equal(torch::cat(parts, 0), t));
  EXPECT_THROW(Dataset::split(t, 3), UserError);
  EXPECT_THROW(Dataset::split(t, 0), UserError);
}

// The training program's test is training: a few steps on this data lower a small model's loss
// (the data room's test, since models sits below data).
void expect_loss_falls(const ModelOptions& options, double lr) {
  torch::nn::Sequential model;
  for (int i = 0; i < num_layers(options); ++i) model->push_back(make_layer(options, i));
  DataOptions data_options;
  data_options.batch_size = 16;
  Dataset data(options, data_options);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));
  auto evaluate = [&] {
    torch::NoGradGuard no_grad;
    auto batch = data.batch(1000);
    return compute_loss(options, model->forward(batch.inputs), batch.targets).item<double>();
  };
  const double before = evaluate();
  for (int step = 0; step < 30; ++step) {
    auto batch = data.batch(step);
    optimizer.zero_grad();
    compute_loss(options, model->forward(batch.inputs), batch.targets).backward();
    optimizer.step();
  }
  const double after = evaluate();
  EXPECT_LT(after, 0.8 * before) << options.kind << ": " << before << " -> " << after;
}

// Three blocks, small enough to train in a moment.
ModelOptions small_model(const std::string& kind) {
  ModelOptions options = gpt(/*seq_len=*/8);
  options.kind = kind;
  options.layers = 3;
  options.d_model = kind == "gpt" ? 16 : 8;
  options.heads = 2;
  options.seed = 7;
  return options;
}

TEST(Dataset, GptLearnsText) {
  expect_loss_falls(small_model("gpt"), 1e-2);
}
TEST(Dataset, MlpLearnsTeacher) {
  expect_loss_falls(small_model("mlp"), 1e-2);
}

TEST(Dataset, RejectsBadSources) {
  DataOptions options;
  options.source = "/nonexistent/file.txt";
  try {
    Dataset data(gpt(), options);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/file.txt"), std::string::npos);
  }

  const std::string path = testing::TempDir() + "pptrain_short.txt";
  std::ofstream(path) << "too short";
  options.source = path;
  EXPECT_THROW(Dataset(gpt(), options), UserError);
  std::remove(path.c_str());

  options = DataOptions();
  options.batch_size = 6;
  options.microbatches = 4;
  EXPECT_THROW(Dataset(gpt(), options), UserError);

  ModelOptions mlp;
  mlp.kind = "mlp";
  options = DataOptions();
  options.source = "/usr/share/common-licenses/GPL-3";
  EXPECT_THROW(Dataset(mlp, options), UserError);
}

}  // namespace
}  // namespace pptrain
