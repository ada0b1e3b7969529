// What crosses a cut as a bundle: a transformer-like model of the program's own whose stages
// pass hidden states (float32), position ids (int64) and a padding mask (bool), on every
// synchronous schedule, with fixed and with per-batch sequence lengths, against one process;
// and the errors of stages that do not fit each other.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "pptrain/api/pipeline.h"
#include "pptrain/api/testing.h"
#include "pptrain/common/check.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/testing.h"

namespace pptrain {
namespace {

constexpr int64_t kVocab = 11;
constexpr int64_t kWidth = 16;
constexpr int64_t kMaxLength = 12;
constexpr int kBlocks = 6;  // layers: embedding, 6 blocks, head
constexpr int kLayers = kBlocks + 2;
constexpr int kSteps = 3;
constexpr int64_t kBatch = 16;

// Ranks are threads here and torch's global generator is shared: whoever seeds it holds this.
std::mutex seeding;

// One layer of the model; `kind` 0: embedding, 1: block, 2: head.
//   embedding  {ids int64 [mb, T]} -> {hidden float32 [mb, T, W], positions int64 [mb, T],
//              mask bool [mb, T] (false on padding, id 0)}
//   block      {hidden, positions, mask} -> the same names: hidden changed where mask is true,
//              by a function of hidden and of the positions
//   head       {hidden, positions, mask} -> logits float32 [mb, T, V] (one tensor)
// A tied head (kind 3) computes its logits with the token table: `shared` (the embedding's,
// when one module holds both) or a table of its own, which the pipeline keeps equal to the
// embedding's (PipelineOptions::tied).
struct ToyLayerImpl : torch::nn::Module {
  ToyLayerImpl(int kind, int index, torch::Tensor shared = {}) : kind(kind) {
    std::lock_guard<std::mutex> lock(seeding);
    torch::manual_seed(500 + index);
    if (kind == 0) {
      tokens = register_module("tokens", torch::nn::Embedding(kVocab, kWidth));
      places = register_module("places", torch::nn::Embedding(kMaxLength, kWidth));
    } else {
      norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    }
    if (kind == 1 || kind == 2) {
      linear = register_module("linear", torch::nn::Linear(kWidth, kind == 1 ? kWidth : kVocab));
    }
    if (kind == 3) {
      bias = register_parameter("bias", torch::zeros({kVocab}));
      table =
          shared.defined() ? shared : register_parameter("table", torch::randn({kVocab, kWidth}));
    }
  }

  TensorBundle forward(const TensorBundle& in) {
    if (kind == 0) {
      const torch::Tensor& ids = in["ids"];
      const torch::Tensor positions =
          torch::arange(ids.size(1), torch::kInt64).unsqueeze(0).expand_as(ids).contiguous();
      // The batch may bring the mask itself (take_from_batch): then it is that one.
      TensorBundle out({{"hidden", tokens(ids) + places(positions)},
                        {"positions", positions},
                        {"mask", in.contains("mask") ? in["mask"] : ids != 0}});
      if (skip) out.add("early", torch::tanh(tokens(ids)));
      return out;
    }
    // The head adds what the embedding sent it past the blocks (a skip connection).
    const torch::Tensor hidden =
        kind >= 2 && in.contains("early") ? in["hidden"] + in["early"] : in["hidden"];
    if (kind == 2) return linear(norm(hidden));
    if (kind == 3) return torch::linear(norm(hidden), table, bias);
    const torch::Tensor where = in["mask"].unsqueeze(-1).to(torch::kFloat32);
    const torch::Tensor phase = in["positions"].to(torch::kFloat32).unsqueeze(-1) / kMaxLength;
    const torch::Tensor update = torch::tanh(linear(norm(hidden)) + phase);
    TensorBundle out({{"hidden", hidden + where * update},
                      {"positions", in["positions"]},
                      {"mask", in["mask"]}});
    if (in.contains("early")) out.add("early", in["early"]);  // in one process: passed along
    return out;
  }

  int kind;
  bool skip = false;  // the embedding also outputs "early" for the head
  torch::nn::Embedding tokens{nullptr}, places{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear linear{nullptr};
  torch::Tensor bias, table;  // kind 3
};
TORCH_MODULE(ToyLayer);

// Layers [first, last] of the model, run in order: one stage, or (0 .. kLayers-1) the model.
// `tied`: the head takes its logits from the token table. `skip`: the embedding sends the head
// a tensor of its own ("early") beside the hidden states.
struct ToyPartImpl : torch::nn::Module {
  ToyPartImpl(int first, int last, bool tied = false, bool skip = false) {
    for (int i = first; i <= last; ++i) {
      const int kind = i == 0 ? 0 : i == kLayers - 1 ? (tied ? 3 : 2) : 1;
      const torch::Tensor shared =
          kind == 3 && first == 0 ? layers[0]->tokens->weight : torch::Tensor();
      layers.push_back(register_module("layer" + std::to_string(i), ToyLayer(kind, i, shared)));
      layers.back()->skip = skip;
    }
  }
  TensorBundle forward(const TensorBundle& in) {
    TensorBundle x = in;
    for (auto& layer : layers) x = layer->forward(x);
    if (!sends_mask && x.contains("mask")) {
      x = TensorBundle({{"hidden", x["hidden"]}, {"positions", x["positions"]}});
    }
    return x;
  }
  std::vector<ToyLayer> layers;
  // false: the next stage takes the mask from the batch, so this one does not send it.
  bool sends_mask = true;
};
TORCH_MODULE(ToyPart);

torch::Tensor token_loss(const TensorBundle& output, const TensorBundle& target) {
  const torch::Tensor& logits = output.only();
  return torch::cross_entropy_loss(logits.reshape({-1, kVocab}), target.only().reshape({-1}));
}

// Step k's batch: ids of length lengths[k] with some padding (id 0) at the ends of rows, and
// the next ids as targets.
// With `with_mask`, the inputs bring the padding mask too.
std::pair<TensorBundle, TensorBundle> toy_batch(int step, int64_t length, bool with_mask = false) {
  auto generator = at::detail::createCPUGenerator(300 + step);
  torch::Tensor ids = torch::randint(1, kVocab, {kBatch, length + 1}, generator);
  ids.index_put_({torch::indexing::Slice(0, kBatch, 3), torch::indexing::Slice(length - 2)}, 0);
  TensorBundle inputs({{"ids", ids.narrow(1, 0, length).contiguous()}});
  if (with_mask) inputs.add("mask", inputs["ids"] != 0);
  return {inputs, TensorBundle(ids.narrow(1, 1, length).contiguous())};
}

using Result = testing::Trained;
using testing::expect_equal;

Result one_process(const std::vector<int64_t>& lengths, int microbatches, bool tied = false,
                   bool skip = false) {
  ToyPart model(0, kLayers - 1, tied, skip);
  return testing::train_in_one_process(
      model->parameters(), kSteps, microbatches, [&](int k, int m) {
        const auto [inputs, targets] = toy_batch(k, lengths[k]);
        return token_loss(model->forward(split_bundle(inputs, microbatches, "input")[m]),
                          split_bundle(targets, microbatches, "target")[m]);
      });
}

// The model cut evenly into the schedule's stages, every rank a thread. Returns the errors of
// the ranks ("" when none), and in `result` the losses and each stage's weights. With
// options.tied, the head ties its table to the embedding's ("embedding", stages 0 and S-1): the
// head's copy is left out of `result`, and every copy must equal the others bit for bit after
// every step.
std::string pipelined(int ranks, const PipelineOptions& options,
                      const std::vector<int64_t>& lengths, Result& result,
                      bool mask_from_batch = false,
                      std::chrono::milliseconds timeout = kDefaultCommTimeout) {
  const bool skip = !options.skips.empty();
  auto transports = make_loopback_transports(ranks, timeout);
  std::vector<std::vector<double>> losses(ranks);
  std::vector<std::vector<std::vector<torch::Tensor>>> weights(ranks);  // [rank][stage]
  std::vector<std::vector<torch::Tensor>> copies(kSteps);               // [step]: every tied copy
  const std::string errors = testing::run_rank_threads(ranks, [&](int r) {
    World world{r, ranks, std::move(transports[r])};
    const StagePlacement placement = place_stages(world, options);
    const int per_stage = kLayers / placement.num_stages;
    std::vector<ToyPart> parts;
    std::vector<PipelineStage> stages;
    stages.reserve(placement.local.size());
    const bool tied = !options.tied.empty();
    for (int s : placement.local) {
      parts.emplace_back(s * per_stage, (s + 1) * per_stage - 1, tied, skip);
      stages.emplace_back(parts.back(), s, placement.num_stages);
      if (mask_from_batch) {
        parts.back()->sends_mask = false;
        if (s > 0) stages.back().take_from_batch({"mask"});
      }
      if (tied && s == 0)
        stages.back().tie("embedding", parts.back()->layers.front()->tokens->weight);
      if (tied && s == placement.num_stages - 1) {
        stages.back().tie("embedding", parts.back()->layers.back()->table);
      }
    }
    std::vector<PipelineStage*> pointers;
    std::vector<torch::Tensor> params;
    for (auto& stage : stages) {
      pointers.push_back(&stage);
      for (auto& p : stage.parameters()) params.push_back(p);
    }
    PipelineSchedule schedule(world, pointers, options, BundleLossFn(token_loss));
    torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      const auto [inputs, targets] = toy_batch(step, lengths[step], mask_from_batch);
      const torch::Tensor loss = schedule.step(inputs, targets);
      optimizer.step();
      if (loss.defined()) losses[r].push_back(loss.item<double>());
      for (auto& stage : stages) {
        for (const auto& [name, tensor] : stage.ties()) {
          std::lock_guard<std::mutex> lock(seeding);
          copies[step].push_back(tensor.detach().clone());
        }
      }
    }
    schedule.finish();
    weights[r].resize(placement.num_stages);
    for (auto& stage : stages) {
      for (auto& p : stage.parameters()) {
        const bool head_copy = tied && stage.index() > 0 && !stage.ties().empty() &&
                               stage.ties().front().second.is_same(p);
        if (!head_copy) weights[r][stage.index()].push_back(p.detach().clone());
      }
    }
  });
  if (!errors.empty()) return errors;
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(copies[step].size(), options.tied.empty() ? 0u : 2u);
    for (const auto& copy : copies[step]) {
      EXPECT_TRUE(torch::equal(copy, copies[step][0])) << "a tied copy differs after step " << step;
    }
  }
  result.losses.assign(kSteps, 0);
  for (const auto& rank_losses : losses) {
    for (size_t k = 0; k < rank_losses.size() && k < kSteps; ++k)
      result.losses[k] += rank_losses[k];
  }
  for (size_t s = 0; s < weights[0].size(); ++s) {
    for (int r = 0; r < ranks; ++r) {
      if (weights[r][s].empty()) continue;
      result.weights.insert(result.weights.end(), weights[r][s].begin(), weights[r][s].end());
      break;  // the first holder's (replicas are checked equal by the library's own tests)
    }
  }
  return "";
}

const std::vector<std::string> kSynchronous = {"gpipe", "1f1b",      "interleaved-1f1b", "zb-h1",
                                               "zb-h2", "zb-v",      "zb-auto",          "v-half",
                                               "v-min", "dualpipev", "chimera",          "gems"};

void expect_every_schedule_equals_one_process(const std::vector<int64_t>& lengths) {
  const Result want = one_process(lengths, 8);
  for (int ranks : {2, 4}) {
    for (const std::string& name : kSynchronous) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 8;
      Result got;
      const std::string what = name + " on " + std::to_string(ranks) + " ranks";
      ASSERT_EQ(pipelined(ranks, options, lengths, got), "") << what;
      expect_equal(got, want, what);
    }
  }
}

TEST(Bundles, ThreeTensorsOfThreeDtypesCrossEveryCut) {
  expect_every_schedule_equals_one_process({9, 9, 9});
}

// Each batch has its own sequence length: the messages tell the receivers their shapes.
TEST(Bundles, SequenceLengthsChangeFromBatchToBatch) {
  expect_every_schedule_equals_one_process({5, 12, 7});
}

// Later stages take the mask straight from the batch: stage 0 sends only the hidden states and
// the positions.
TEST(Bundles, LaterStagesTakeTheMaskFromTheBatch) {
  const std::vector<int64_t> lengths = {6, 9, 7};
  const Result want = one_process(lengths, 8);
  for (int ranks : {2, 4}) {
    for (const std::string name : {"1f1b", "zb-v", "interleaved-1f1b", "chimera"}) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 8;
      Result got;
      const std::string what = name + " on " + std::to_string(ranks) + " ranks";
      ASSERT_EQ(pipelined(ranks, options, lengths, got, /*mask_from_batch=*/true), "") << what;
      expect_equal(got, want, what);
    }
  }
}

// Recomputation and the fused I/W path keep the bundles' ends too.
TEST(Bundles, RecomputationAndTheDeferredSplitCarryBundles) {
  const std::vector<int64_t> lengths = {6, 10, 8};
  const Result want = one_process(lengths, 8);
  for (bool recompute : {false, true}) {
    for (auto split :
         {ExecutorOptions::WeightSplit::kAutograd, ExecutorOptions::WeightSplit::kDeferredLayers}) {
      PipelineOptions options;
      options.schedule = "zb-v";
      options.microbatches = 8;
      options.recompute = recompute;
      options.weight_split = split;
      Result got;
      ASSERT_EQ(pipelined(2, options, lengths, got), "");
      expect_equal(got, want, "zb-v, recompute " + std::to_string(recompute));
    }
  }
}

// A skip connection from the first stage to the last: the embedding's "early" goes to the head
// past every stage between (which never see it), and its gradient comes straight back; on one
// rank (V shapes) it is handed over, across ranks it is a message of its own.
TEST(Bundles, ASkipConnectionFromTheFirstStageToTheLast) {
  const std::vector<int64_t> lengths = {7, 9, 7};
  const Result want = one_process(lengths, 8, /*tied=*/false, /*skip=*/true);
  for (int ranks : {2, 4}) {
    for (const std::string& name : kSynchronous) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 8;
      const int stages = place_stages(World{0, ranks, nullptr}, options).num_stages;
      options.skips = {{"early", 0, stages - 1}};
      Result got;
      const std::string what = name + " on " + std::to_string(ranks) + " ranks, skip";
      ASSERT_EQ(pipelined(ranks, options, lengths, got), "") << what;
      expect_equal(got, want, what);
    }
  }
  // Recomputing, and with the fused I/W path.
  for (bool recompute : {false, true}) {
    PipelineOptions options;
    options.schedule = "zb-h1";
    options.microbatches = 8;
    options.recompute = recompute;
    options.weight_split = ExecutorOptions::WeightSplit::kDeferredLayers;
    options.skips = {{"early", 0, 3}};
    Result got;
    ASSERT_EQ(pipelined(4, options, lengths, got), "");
    expect_equal(got, want, "zb-h1 recompute " + std::to_string(recompute) + ", skip");
  }
}

TEST(Bundles, SkipConnectionsThatCannotRunAreRefused) {
  const std::vector<int64_t> lengths = {7, 7, 7};
  Result ignored;
  PipelineOptions options;
  options.schedule = "1f1b";
  options.microbatches = 2;
  options.skips = {{"early", 1, 0}};
  EXPECT_NE(pipelined(2, options, lengths, ignored)
                .find("rank 0: skip connection 'early' from stage 1 to stage 0: give a name and "
                      "stages 0 <= from < to <= 1"),
            std::string::npos);
  options.schedule = "pipedream";
  options.steps = kSteps;
  options.optimizer = OptimizerOptions();
  options.skips = {{"early", 0, 1}};
  const std::string asynchronous = pipelined(2, options, lengths, ignored);
  EXPECT_NE(asynchronous.find("skips: pipedream is asynchronous; skip connections run on "
                              "synchronous schedules"),
            std::string::npos)
      << asynchronous;
  // Stage 1 sends no "late": the error names the stage and what its output holds.
  options.schedule = "1f1b";
  options.optimizer.reset();
  options.skips = {{"late", 1, 3}};
  const std::string errors =
      pipelined(4, options, lengths, ignored, false, std::chrono::milliseconds(2000));
  EXPECT_NE(errors.find("rank 1: stage 1 has a skip connection 'late' to stage 3, but its output "
                        "has no tensor of that name (hidden float32 [8, 7, 16], positions int64 "
                        "[8, 7], mask bool [8, 7], early float32 [8, 7, 16])"),
            std::string::npos)
      << errors;
}

// GPT-style weight tying: the head's logits use the token table. One process shares one
// tensor; the pipelines keep a copy on the first and the last stage and sum their gradients.
TEST(TiedParameters, TiedEmbeddingAndHeadEqualOneSharedTensor) {
  const std::vector<int64_t> lengths = {7, 7, 7};
  const Result want = one_process(lengths, 8, /*tied=*/true);
  for (int ranks : {2, 4}) {
    for (const std::string& name : kSynchronous) {
      if (name == "chimera" || name == "gems") continue;  // replicated: refused below
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 8;
      Result got;
      const int stages = place_stages(World{0, ranks, nullptr}, options).num_stages;
      options.tied = {{"embedding", {0, stages - 1}}};
      const std::string what = name + " on " + std::to_string(ranks) + " ranks, tied";
      ASSERT_EQ(pipelined(ranks, options, lengths, got), "") << what;
      expect_equal(got, want, what);
    }
  }
}

TEST(TiedParameters, CopiesOfOtherShapesAndReplicatedSchedulesAreRefused) {
  PipelineOptions options;
  options.schedule = "1f1b";
  options.microbatches = 2;
  options.tied = {{"embedding", {0, 1}}};
  auto transports = make_loopback_transports(2, std::chrono::milliseconds(5000));
  const std::string errors = testing::run_rank_threads(2, [&](int r) {
    World world{r, 2, std::move(transports[r])};
    ToyPart part = r == 0 ? ToyPart(0, 3, true) : ToyPart(4, kLayers - 1, true);
    PipelineStage stage(part, r, 2);
    // The head ties its bias [V] where the embedding ties its table [V, W].
    stage.tie("embedding",
              r == 0 ? part->layers.front()->tokens->weight : part->layers.back()->bias);
    PipelineSchedule schedule(world, {&stage}, options, BundleLossFn(token_loss));
  });
  const std::string expected =
      "tied parameter 'embedding' is float32 [11, 16] on stage 0 but float32 [11] on stage 1\n";
  EXPECT_EQ(errors, "rank 0: " + expected + "rank 1: " + expected);
  options.schedule = "chimera";
  Result ignored;
  EXPECT_NE(pipelined(2, options, {7, 7, 7}, ignored)
                .find("tied parameter 'embedding': chimera is replicated"),
            std::string::npos);
}

// A stage whose output is not what the next stage takes.
struct DropsTheMaskImpl : torch::nn::Module {
  explicit DropsTheMaskImpl(bool change_dtype) : change_dtype(change_dtype) {}
  TensorBundle forward(const TensorBundle& in) {
    const torch::Tensor hidden =
        in["ids"].to(torch::kFloat32).unsqueeze(-1).expand({-1, -1, kWidth}) * weight;
    if (!change_dtype) return hidden;  // one tensor where the next stage takes three
    // The mask as bool at the first step, as int64 afterwards.
    const torch::Tensor mask = in["ids"] != 0;
    return TensorBundle({{"hidden", hidden},
                         {"positions", torch::zeros_like(in["ids"])},
                         {"mask", steps++ == 0 ? mask : mask.to(torch::kInt64)}});
  }
  bool change_dtype;
  int steps = 0;
  torch::Tensor weight = register_parameter("weight", torch::ones({kWidth}));
};
TORCH_MODULE(DropsTheMask);

std::string run_mismatched(bool change_dtype) {
  auto transports = make_loopback_transports(2, std::chrono::milliseconds(2000));
  return testing::run_rank_threads(2, [&](int r) {
    World world{r, 2, std::move(transports[r])};
    PipelineOptions options;
    options.schedule = "1f1b";
    options.microbatches = 1;
    std::optional<PipelineStage> stage;
    if (r == 0) {
      stage.emplace(DropsTheMask(change_dtype), 0, 2);
    } else {
      stage.emplace(ToyPart(1, kLayers - 1), 1, 2);
    }
    PipelineSchedule schedule(world, {&*stage}, options, BundleLossFn(token_loss));
    for (int step = 0; step < 2; ++step) {
      const auto [inputs, targets] = toy_batch(step, 4);
      schedule.step(inputs, targets);
    }
  });
}

TEST(Bundles, MismatchedStagesFailWithOneLineNamingThem) {
  const std::string missing = run_mismatched(false);
  EXPECT_NE(missing.find("rank 1: stage 1 cannot take its input from stage 0 (#0 float32 [16, 4, "
                         "16]): no tensor 'hidden'"),
            std::string::npos)
      << missing;
  const std::string changed = run_mismatched(true);
  EXPECT_NE(changed.find("rank 0: stage 0 changed its output to stage 1: tensor 2 is mask "
                         "int64, but was mask bool before"),
            std::string::npos)
      << changed;
}

TEST(Bundles, BundlesNameWhatTheyLack) {
  TensorBundle named({{"hidden", torch::zeros({2, 3})}, {"mask", torch::ones({2}, torch::kBool)}});
  EXPECT_EQ(named.describe(), "hidden float32 [2, 3], mask bool [2]");
  try {
    (void)named["ids"];
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "no tensor 'ids' in a bundle of hidden float32 [2, 3], mask bool [2]");
  }
  EXPECT_THROW(TensorBundle({{"a/b", torch::zeros({1})}}), UserError);
  EXPECT_THROW(named.push_back(torch::zeros({1})), UserError);
  const auto parts = split_bundle(named, 2, "input");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].describe(), "hidden float32 [1, 3], mask bool [1]");
  EXPECT_THROW(split_bundle(named, 3, "input"), UserError);
  const TensorBundle grads = gradient_bundle(named, {torch::ones({2, 3}), torch::Tensor()});
  EXPECT_EQ(grads.describe(), "hidden float32 [2, 3]");  // the mask carries no gradient
}

}  // namespace
}  // namespace pptrain
