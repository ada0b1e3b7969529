// End-to-end tests of `pptrain train --precision` (common/precision.h, api/pipeline.h): bf16 and
// fp16 pipelines against the one-process run at the same precision (1e-5 relative in losses and
// float32 master weights), their messages in half the bytes, fp16's loss scale skipping an
// overflowed step on every rank at once, checkpoints across precisions, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;  // TempDir, run_train, read_losses, small_model, expect_same_parameters, ...

// The test's model (8 blocks, enough for 4 ranks x 2 chunks) and run, without --quiet.
std::string loud_args(const std::string& schedule, int steps, int microbatches = 0) {
  // dualpipev: a microbatch per stage.
  if (microbatches == 0) microbatches = schedule == "dualpipev" ? 8 : 4;
  return model_args(small_model("gpt")) + " --batch-size 8 --microbatches " +
         std::to_string(microbatches) + " --steps " + std::to_string(steps) + " --schedule " +
         schedule;
}
std::string common_args(const std::string& schedule, int steps, int microbatches = 0) {
  return loud_args(schedule, steps, microbatches) + " --quiet";
}

using Case = std::tuple<std::string, std::string>;  // precision, schedule

class SamePrecisionReference : public ::testing::TestWithParam<Case> {};

// The sync invariant at a lower precision: the activations are rounded to it at every layer's
// end (runtime/stage.h), so a cut anywhere sends what one process computed there.
TEST_P(SamePrecisionReference, PipelinesEqualOneProcessAtTheirPrecision) {
  const auto& [precision, schedule] = GetParam();
  TempDir dir;
  const std::string args = common_args(schedule, 6) + " --precision " + precision;
  run_reference(args + " --pp 1", dir);
  for (int pp : {2, 4}) {
    SCOPED_TRACE("--pp " + std::to_string(pp) + " --schedule " + schedule);
    expect_run_matches_reference(small_model("gpt"), args + " --pp " + std::to_string(pp),
                                 "pp" + std::to_string(pp), dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, SamePrecisionReference,
                         ::testing::Combine(::testing::Values("bf16", "fp16"),
                                            ::testing::Values("1f1b", "zb-v", "interleaved-1f1b",
                                                              "dualpipev")),
                         pair_test_name<Case>);

// bf16 is not fp32 under another name: its losses differ, its messages are half the bytes, and
// the run says what it computes in.
TEST(Precision, Bf16HalvesTheBytesSentAndTrainsOtherwiseThanFp32) {
  TempDir dir;
  const std::string args = loud_args("1f1b", 4) + " --pp 2 --metrics ";
  const auto fp32 = run_train(args + (dir / "fp32.jsonl").string(), dir);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  const auto bf16 = run_train(args + (dir / "bf16.jsonl").string() + " --precision bf16", dir);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("precision bf16: forwards under autocast"), std::string::npos)
      << bf16.out;
  const auto sent32 = last_metrics_line(dir / "fp32.jsonl").at("bytes_sent");
  const auto sent16 = last_metrics_line(dir / "bf16.jsonl").at("bytes_sent");
  ASSERT_EQ(sent32.size(), 2u);
  for (size_t r = 0; r < sent32.size(); ++r) {
    EXPECT_GT(sent16[r].get<int64_t>(), 0);
    EXPECT_EQ(2 * sent16[r].get<int64_t>(), sent32[r].get<int64_t>()) << "rank " << r;
  }
  const auto l32 = read_losses(dir / "fp32.jsonl"), l16 = read_losses(dir / "bf16.jsonl");
  ASSERT_EQ(l32.size(), l16.size());
  double largest = 0;
  for (size_t i = 0; i < l32.size(); ++i) largest = std::max(largest, std::abs(l32[i] - l16[i]));
  EXPECT_GT(largest, 1e-4) << "bf16 trained as fp32 does";
  EXPECT_LT(largest, 0.1 * l32.front()) << "bf16 trained far from fp32";
}

// An overflow in one copy of the pipeline (the test hook: the last stage's rank of that copy
// starts step 3's backwards from a scale fp16 cannot hold) is one decision for the whole step:
// every rank of every copy skips its optimizer step and halves the scale, as the one-process run
// given the same overflow does; the run then goes on equal to it. With 1f1b, zb-v (the last
// stage on rank 0), post-validation and ZeRO-1 over two copies (the overflow in the second).
TEST(Precision, Fp16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  const std::string at_step = "PPTRAIN_TEST_OVERFLOW_STEP=3 ";
  struct Layout {
    std::string schedule, flags;
    int rank;          // of the copy's last stage
    int microbatches;  // per copy; the reference's microbatches are as large (two copies: M x 2)
  };
  TempDir dir;
  for (const Layout& layout : {Layout{"zb-v", " --pp 2", 0, 4},
                               Layout{"1f1b", " --pp 2 --post-validation --exact-rollback", 1, 4},
                               Layout{"zb-v", " --pp 2 --dp 2 --zero 1", 2, 4}}) {
    SCOPED_TRACE(layout.schedule + layout.flags);
    const int copies = layout.flags.find("--dp 2") != std::string::npos ? 2 : 1;
    // --pp 1: every schedule name means the same one-stage run.
    const auto ref =
        run_train(common_args("1f1b", 6, layout.microbatches * copies) +
                      " --precision fp16 --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                      " --save " + (dir / "ref").string(),
                  dir, at_step + "PPTRAIN_TEST_OVERFLOW_RANK=0 ");
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const auto run = run_train(
        common_args(layout.schedule, 6, layout.microbatches) + " --precision fp16" + layout.flags +
            " --metrics " + (dir / "pp2.jsonl").string() + " --save " + (dir / "pp2").string(),
        dir, at_step + "PPTRAIN_TEST_OVERFLOW_RANK=" + std::to_string(layout.rank) + " ");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    expect_same_losses(read_losses(dir / "pp2.jsonl"), read_losses(dir / "ref.jsonl"));
    expect_same_parameters(small_model("gpt"), dir / "pp2", dir / "ref");
    const auto scales = read_field(dir / "pp2.jsonl", "loss_scale");
    ASSERT_EQ(scales.size(), 6u);
    EXPECT_EQ(scales[2], 65536);  // the scale step 3 ran at; it overflowed
    EXPECT_EQ(scales[3], 32768);
    std::ifstream in(dir / "pp2.jsonl");
    std::string line;
    std::vector<bool> skipped;
    while (std::getline(in, line)) skipped.push_back(nlohmann::json::parse(line).at("skipped"));
    EXPECT_EQ(skipped, (std::vector<bool>{false, false, true, false, false, false}));
    // Without the overflow the step is taken: the losses after it differ.
    const auto plain =
        run_train(common_args(layout.schedule, 6, layout.microbatches) + " --precision fp16" +
                      layout.flags + " --metrics " + (dir / "plain.jsonl").string(),
                  dir);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(read_losses(dir / "plain.jsonl")[3], read_losses(dir / "pp2.jsonl")[3]);
  }
}

// fp16's scale is part of the checkpoint: a run stopped after its overflow and resumed goes on
// at the halved scale, equal to the uninterrupted run; a bf16 checkpoint resumed at fp32 says
// what it was trained at.
TEST(Precision, CheckpointsKeepTheLossScaleAndNameTheirPrecision) {
  const std::string overflow = "PPTRAIN_TEST_OVERFLOW_STEP=2 PPTRAIN_TEST_OVERFLOW_RANK=1 ";
  const std::string fp16 = " --pp 2 --precision fp16";
  TempDir dir;
  const auto whole =
      run_train(common_args("1f1b", 6) + fp16 + " --metrics " + (dir / "whole.jsonl").string() +
                    " --save " + (dir / "whole").string(),
                dir, overflow);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto first = run_train(common_args("1f1b", 4) + fp16 + " --save " + (dir / "part").string(),
                               dir, overflow);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto rest = run_train(
      common_args("1f1b", 6) + fp16 + " --resume " + (dir / "part").string() + " --metrics " +
          (dir / "rest.jsonl").string() + " --save " + (dir / "part").string(),
      dir);
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  const auto whole_losses = read_losses(dir / "whole.jsonl");
  ASSERT_EQ(whole_losses.size(), 6u);
  expect_same_losses(read_losses(dir / "rest.jsonl"),
                     std::vector<double>(whole_losses.begin() + 4, whole_losses.end()));
  EXPECT_EQ(read_field(dir / "rest.jsonl", "loss_scale").front(), 32768);
  expect_same_parameters(small_model("gpt"), dir / "part", dir / "whole");

  const auto bf16 = run_train(
      common_args("1f1b", 2) + " --pp 2 --precision bf16 --save " + (dir / "bf16").string(), dir);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  const auto fp32 =
      run_train(loud_args("1f1b", 4) + " --pp 2 --resume " + (dir / "bf16").string(), dir);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("(trained at bf16, going on at fp32: the float32 parameters and "
                          "optimizer state carry over as they are)"),
            std::string::npos)
      << fp32.out;
}

// An asynchronous schedule at bf16 is its own one-process rule at bf16 (--pp 1 --stages S), and
// the I/W split and recomputation under autocast change nothing of a synchronous one.
TEST(Precision, Bf16AsynchronousRulesAndSplitsEqualTheirReferences) {
  for (const std::string schedule : {"pipedream", "2bw"}) {
    SCOPED_TRACE(schedule);
    TempDir dir;
    const std::string args = common_args(schedule, 6) + " --precision bf16";
    run_reference(args + " --pp 1 --stages 2", dir);
    expect_run_matches_reference(small_model("gpt"), args + " --pp 2", "pp2", dir);
  }
  TempDir dir;
  const std::string args = common_args("zb-v", 6) + " --pp 2 --precision bf16";
  run_reference(args, dir);
  for (const std::string flags : {" --recompute", " --weight-split autograd"}) {
    SCOPED_TRACE(flags);
    expect_run_matches_reference(small_model("gpt"), args + flags, "other", dir);
  }
}

// A step that casts each weight once (--weight-casts step) computes what casting at every use
// does, so it too equals the one-process run at its precision: with the I/W split either way,
// recomputation, and fp16's loss scale.
TEST(Precision, WeightsCastOncePerStepTrainAsCastsPerUseDo) {
  for (const std::string precision : {"bf16", "fp16"}) {
    TempDir dir;
    const std::string args = common_args("zb-v", 6) + " --precision " + precision;
    run_reference(args + " --pp 1", dir);
    for (const std::string flags : {" --pp 2", " --pp 2 --recompute",
                                    " --pp 2 --weight-split autograd", " --pp 4 --recompute"}) {
      SCOPED_TRACE(precision + flags);
      expect_run_matches_reference(small_model("gpt"), args + flags + " --weight-casts step",
                                   "step", dir);
    }
  }
  TempDir dir;
  const auto run =
      run_train(loud_args("1f1b", 1) + " --pp 2 --precision bf16 --weight-casts step", dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("each weight cast once per step"), std::string::npos) << run.out;
}

TEST(Precision, BadInputIsOneLineError) {
  TempDir dir;
  expect_one_line_error(run_train(common_args("1f1b", 2) + " --pp 2 --precision fp8", dir),
                        "--precision fp8: expected fp32, bf16 or fp16");
  expect_one_line_error(
      run_train(common_args("pipedream", 2) + " --pp 2 --precision fp16", dir),
      "--precision fp16 skips the steps whose gradients overflow, on every rank at once, but "
      "pipedream steps its stages at different times: use --precision bf16");
  expect_one_line_error(run_train(common_args("1f1b", 2) + " --pp 2 --weight-casts layer", dir),
                        "--weight-casts must be microbatch or step, got 'layer'");
  expect_one_line_error(run_train(common_args("1f1b", 2) + " --pp 2 --weight-casts step", dir),
                        "--weight-casts step keeps each weight's cast to the compute dtype for "
                        "the step, but --precision fp32 casts nothing: use --precision bf16 or "
                        "fp16");
  expect_one_line_error(
      run_train(common_args("pipedream", 2) + " --pp 2 --precision bf16 --weight-casts step", dir),
      "--weight-casts step is for synchronous schedules; pipedream runs microbatches on weight "
      "versions that change within a step");
}

}  // namespace
}  // namespace pptrain
