// End-to-end tests of data parallelism (--dp D): D copies of a P-rank pipeline, each on 1/D of
// the batch, averaging each stage's gradients before the optimizer step. The result must equal
// one process on the whole batch (--pp 1, same seed and --batch-size) to 1e-5 relative in every
// loss and final parameter. A copy that skipped the average would have trained on half the
// data and could not pass.
//
// The cases use SGD: the copies sum their halves before adding them, so the gradients differ
// from one process's in the last bits, and AdamW turns a gradient that is zero but for rounding
// (the attention's key bias, whose true gradient is exactly 0) into a full step of +-lr, so its
// weights drift apart by more than 1e-5 although nothing is wrong. (A pipeline alone computes
// the same sums in the same order as one process, so tests/train_test.cpp can use AdamW.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;

struct Case {
  std::string kind, schedule;
  int pp = 2, dp = 2;
  std::string optimizer = "sgd";
};

class DataParallel : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallel, EqualsOneProcessOnTheWholeBatch) {
  const Case& c = GetParam();
  const ModelOptions model = small_model(c.kind);
  const int steps = 6;
  TempDir dir;
  const std::string common = model_args(model) + " --batch-size 24 --microbatches 4 --steps " +
                             std::to_string(steps) + " --quiet --optimizer " + c.optimizer;
  const auto ref = run_train(common + " --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                                 " --save " + (dir / "ref").string(),
                             dir);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const auto run =
      run_train(common + " --schedule " + c.schedule + " --pp " + std::to_string(c.pp) + " --dp " +
                    std::to_string(c.dp) + " --metrics " + (dir / "dp.jsonl").string() +
                    " --save " + (dir / "dp").string() + " --trace " + (dir / "t.json").string(),
                dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto losses = read_losses(dir / "dp.jsonl");
  ASSERT_EQ(losses.size(), static_cast<size_t>(steps));
  expect_same_losses(losses, read_losses(dir / "ref.jsonl"));
  expect_same_parameters(model, dir / "dp", dir / "ref");

  // Every world rank has its row, and each rank's all-reduce is on the trace.
  const auto trace = nlohmann::json::parse(read_text(dir / "t.json"));
  int reductions = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("name", "").find("REDUCE_GRAD") != std::string::npos) ++reductions;
  }
  EXPECT_GE(reductions, c.pp * c.dp);
}

INSTANTIATE_TEST_SUITE_P(Copies, DataParallel,
                         ::testing::Values(Case{"gpt", "1f1b", 2, 2}, Case{"gpt", "zb-h1", 2, 2},
                                           Case{"mlp", "1f1b", 1, 2}, Case{"mlp", "zb-v", 2, 2},
                                           Case{"gpt", "zb-v", 2, 2}, Case{"mlp", "1f1b", 1, 3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.kind + "_" + info.param.schedule + "_pp" +
                                              std::to_string(info.param.pp) + "_dp" +
                                              std::to_string(info.param.dp);
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// Replicated stages: chimera and gems hold every stage twice (worker r: stage r going down,
// P-1-r going up), bitpipe every one of its 2P stages (two V's in opposite directions), half the
// microbatches each way, and the two copies sum their gradients; a synchronous schedule, so
// equal to --pp 1.
class ReplicatedStages : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ReplicatedStages, EqualOneProcess) {
  const auto& [kind, schedule] = GetParam();
  const ModelOptions model = small_model(kind);
  TempDir dir;
  const std::string common = model_args(model) + " --batch-size 16 --microbatches 8 --steps 5 " +
                             "--quiet --schedule " + schedule;
  const auto ref = run_train(common + " --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                                 " --save " + (dir / "ref").string(),
                             dir);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  for (int pp : {2, 4}) {
    SCOPED_TRACE("--pp " + std::to_string(pp));
    expect_run_matches_reference(model, common + " --pp " + std::to_string(pp),
                                 "pp" + std::to_string(pp), dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Bidirectional, ReplicatedStages,
                         ::testing::Combine(::testing::Values("gpt", "mlp"),
                                            ::testing::Values("chimera", "gems", "bitpipe")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// PipeDream's uneven replication: a partition with replicas [3, 1] (as `pptrain partition
// --method pipedream` writes it) on 4 workers runs the round robin 1f1b-rr, microbatch i on
// replica i mod 3 of stage 0, and equals one process.
TEST(RoundRobin, ThreeAndOneReplicasEqualOneProcess) {
  const ModelOptions model = small_model("gpt");  // 10 layers: embedding, 8 blocks, head
  TempDir dir;
  std::ofstream(dir / "plan.json") << R"({"method": "pipedream", "stages": [
      {"first_layer": 0, "last_layer": 4, "replicas": 3, "compute_s": 0.01},
      {"first_layer": 5, "last_layer": 9, "replicas": 1, "compute_s": 0.01}],
      "time_per_minibatch_s": 0.01, "speedup_vs_single": 1})";
  const std::string common =
      model_args(model) + " --batch-size 12 --microbatches 6 --steps 5 --quiet";
  const auto ref = run_train(common + " --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                                 " --save " + (dir / "ref").string(),
                             dir);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  expect_run_matches_reference(
      model, common + " --pp 4 --partition " + (dir / "plan.json").string(), "rr", dir);
  expect_one_line_error(
      run_train(common + " --pp 2 --partition " + (dir / "plan.json").string(), dir),
      "places its 2 stages on 4 workers (their replicas), but --pp is 2");
  expect_one_line_error(
      run_train(common + " --pp 4 --schedule zb-h1 --partition " + (dir / "plan.json").string(),
                dir),
      "replicates stages, which runs PipeDream's round robin (1f1b-rr), not --schedule zb-h1");
}

// The "optimizer_state_bytes" of each rank in the last line of a --metrics file.
std::vector<int64_t> read_state_bytes(const fs::path& metrics) {
  return last_metrics_line(metrics).at("optimizer_state_bytes").get<std::vector<int64_t>>();
}

// --zero 1 shards AdamW's moments over the copies: each copy steps the layers it owns and
// shares their weights, which changes no bit of the result, and each rank holds about half the
// state; the two copies of a pipeline rank together hold exactly the unsharded state. A
// checkpoint of a sharded run (each copy writes its own layers' state) resumes on the same
// trajectory.
TEST(Zero, OneShardsTheStateAndChangesNothing) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common = model_args(model) +
                             " --batch-size 16 --microbatches 4 --quiet --optimizer adamw "
                             "--schedule 1f1b --pp 2 --dp 2";
  const auto full = run_train(common + " --steps 6 --metrics " + (dir / "full.jsonl").string() +
                                  " --save " + (dir / "full").string(),
                              dir);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const auto zero =
      run_train(common + " --zero 1 --steps 6 --metrics " + (dir / "zero.jsonl").string() +
                    " --save " + (dir / "zero").string(),
                dir);
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  expect_same_losses(read_losses(dir / "zero.jsonl"), read_losses(dir / "full.jsonl"), 1e-7);
  expect_same_parameters(model, dir / "zero", dir / "full", 1e-7);

  const auto sharded = read_state_bytes(dir / "zero.jsonl");
  const auto whole = read_state_bytes(dir / "full.jsonl");
  ASSERT_EQ(sharded.size(), 4u);
  ASSERT_EQ(whole.size(), 4u);
  for (int p = 0; p < 2; ++p) {
    SCOPED_TRACE("pipeline rank " + std::to_string(p));
    EXPECT_GT(whole[p], 0);
    EXPECT_EQ(whole[p], whole[p + 2]);
    EXPECT_EQ(sharded[p] + sharded[p + 2], whole[p]);
    EXPECT_LE(sharded[p], 0.6 * whole[p]);
    EXPECT_LE(sharded[p + 2], 0.6 * whole[p]);
  }

  // 3 steps, save, resume to 6: the same as 6 in one go.
  const auto first =
      run_train(common + " --zero 1 --steps 3 --save " + (dir / "half").string(), dir);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto resumed =
      run_train(common + " --zero 1 --steps 6 --resume " + (dir / "half").string() + " --metrics " +
                    (dir / "resumed.jsonl").string() + " --save " + (dir / "resumed").string(),
                dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto six = read_losses(dir / "zero.jsonl");
  expect_same_losses(read_losses(dir / "resumed.jsonl"), {six.begin() + 3, six.end()}, 1e-6);
  expect_same_parameters(model, dir / "resumed", dir / "zero", 1e-6);
}

// avgpipe: D pipelines that combine no gradients and pull their weights together every K steps
// (elastic averaging). Each pipeline is synchronous, so --pp S equals the same copies in one
// process each (--pp 1), and the copies' independent steps make it differ from --dp with
// averaged gradients from the second step on (the first loss is the initial weights').
TEST(AvgPipe, PipelinedEqualsOneProcessCopiesAndDiffersFromAveragedGradients) {
  for (const std::string kind : {"gpt", "mlp"}) {
    const ModelOptions model = small_model(kind);
    TempDir dir;
    const std::string common = model_args(model) +
                               " --batch-size 16 --microbatches 4 --steps 5 --quiet --dp 2 "
                               "--avg-interval 2";
    const auto ref =
        run_train(common + " --schedule avgpipe --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                      " --save " + (dir / "ref").string(),
                  dir);
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    for (int pp : {2, 4}) {
      SCOPED_TRACE(kind + " --pp " + std::to_string(pp));
      expect_run_matches_reference(model, common + " --schedule avgpipe --pp " + std::to_string(pp),
                                   "pp" + std::to_string(pp), dir);
    }
    const auto sync = run_train(common.substr(0, common.find(" --avg-interval")) +
                                    " --pp 1 --metrics " + (dir / "sync.jsonl").string(),
                                dir);
    ASSERT_EQ(sync.exit_code, 0) << sync.err;
    const auto averaged = read_losses(dir / "sync.jsonl");
    const auto losses = read_losses(dir / "ref.jsonl");
    ASSERT_EQ(losses.size(), averaged.size());
    EXPECT_NEAR(losses[0], averaged[0], 1e-6 * std::abs(averaged[0]));
    for (size_t step = 1; step < losses.size(); ++step) {
      EXPECT_GT(std::abs(losses[step] - averaged[step]), 1e-5 * std::abs(averaged[step]))
          << "step " << step + 1 << " equals the run with averaged gradients";
    }
  }
}

// Unequal shares (--dp-shares 24,8): copy 0 trains on 24 samples of the batch of 32 in
// microbatches of 6, copy 1 on the last 8 in microbatches of 2, and each copy's gradients (and
// loss) weigh its share of the batch: still one process on the whole batch, with --zero 1 too,
// and with one rank per copy (8,24: the small share first). Copies averaged as equals would
// weigh copy 1's samples three times as much and fail. Equal shares given explicitly are the run
// without them, bit for bit.
TEST(DataParallelShares, UnequalSharesEqualOneProcess) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common =
      model_args(model) + " --batch-size 32 --microbatches 4 --steps 5 --quiet --optimizer sgd";
  run_reference(common + " --pp 1", dir);
  expect_run_matches_reference(model, common + " --pp 2 --dp 2 --dp-shares 24,8", "shares", dir);
  expect_run_matches_reference(model, common + " --pp 2 --dp 2 --dp-shares 24,8 --zero 1", "zero",
                               dir);
  expect_run_matches_reference(model, common + " --pp 1 --dp 2 --dp-shares 8,24", "pp1", dir);

  const auto equal = [&](const std::string& tag, const std::string& flags) {
    const auto run =
        run_train(common + " --pp 2 --dp 2" + flags + " --metrics " +
                      (dir / (tag + ".jsonl")).string() + " --save " + (dir / tag).string(),
                  dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
  };
  equal("no_flag", "");
  equal("equal", " --dp-shares 16,16");
  EXPECT_EQ(read_losses(dir / "equal.jsonl"), read_losses(dir / "no_flag.jsonl"));
  expect_same_parameters(model, dir / "equal", dir / "no_flag", /*tolerance=*/0);
}

TEST(DataParallelShares, BadSharesAreOneLineErrors) {
  TempDir dir;
  const std::string common = model_args(small_model("mlp")) +
                             " --steps 1 --quiet --pp 2 --dp 2 --batch-size 32 --microbatches 4";
  const std::pair<const char*, const char*> cases[] = {
      {" --dp-shares 24,4", "--dp-shares 24,4 sum to 28, but --batch-size is 32"},
      {" --dp-shares 16,8,8", "--dp-shares has 3 shares, but the run has 2 copies of the pipeline"},
      {" --dp-shares 18,14",
       "--dp-shares: copy 0's share 18 is not a positive multiple of the 4 microbatches"},
      {" --dp-shares 32,0", "--dp-shares: '0' is not a number of samples >= 1"},
      {" --dp-shares 24,x", "--dp-shares: 'x' is not a number of samples >= 1"},
      {" --dp-shares 24,8 --schedule avgpipe",
       "--dp-shares 24,8: avgpipe's copies pull their weights together as equals"},
  };
  for (const auto& [flags, expected] : cases) {
    SCOPED_TRACE(flags);
    expect_one_line_error(run_train(common + flags, dir), expected);
  }
}

TEST(DataParallel, BadFlagsAreOneLineErrors) {
  TempDir dir;
  const std::string common = model_args(small_model("mlp")) + " --steps 1 --quiet";
  expect_one_line_error(run_train(common + " --pp 2 --dp 0 --batch-size 8 --microbatches 4", dir),
                        "--dp must be >= 1, got 0");
  expect_one_line_error(run_train(common + " --pp 2 --dp 2 --batch-size 12 --microbatches 4", dir),
                        "--batch-size 12 is not a positive multiple of --dp 2 x --microbatches 4");
  expect_one_line_error(
      run_train(common + " --pp 2 --dp 2 --batch-size 16 --microbatches 4 --schedule pipedream",
                dir),
      "--dp 2 needs a synchronous schedule, but pipedream does not flush");
  expect_one_line_error(
      run_train(common + " --pp 2 --zero 1 --batch-size 16 --microbatches 4", dir),
      "--zero 1 shards the optimizer state over the copies of the pipeline; it needs --dp 2");
  expect_one_line_error(
      run_train(common + " --pp 2 --batch-size 16 --microbatches 4 --schedule avgpipe", dir),
      "--schedule avgpipe averages the weights of --dp D >= 2 pipelines, got --dp 1");
  expect_one_line_error(
      run_train(common + " --pp 2 --dp 2 --batch-size 16 --microbatches 4 --avg-interval 2", dir),
      "--avg-interval applies to --schedule avgpipe only, not '1f1b'");
  expect_one_line_error(run_train(common + " --pp 2 --dp 2 --batch-size 16 --microbatches 4 "
                                           "--schedule avgpipe --avg-alpha 1",
                                  dir),
                        "--avg-alpha must be in (0, 2 / D) = (0, 1), got 1");
}

}  // namespace
}  // namespace pptrain
