// The memory model against measured peaks (sim/memory_model.h, api/pipeline.h): on gpt and mlp,
// 2 and 4 ranks, for every kind of schedule (1F1B, zero bubble, V shapes, asynchronous weight
// versions, Chimera's and BitPipe's replicas, data parallelism with ZeRO-1, recomputation) and
// at bf16, every rank's predicted_peak_memory_bytes is within 10% of its peak_memory_bytes at
// every step, also when a step casts each weight once and keeps the copies (--weight-casts step).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "e2e.h"

namespace pptrain::e2e {
namespace {

struct MemoryCase {
  std::string model;  // gpt or mlp
  int ranks = 2;
  std::string flags;  // the schedule and what goes with it
};

void PrintTo(const MemoryCase& c, std::ostream* out) {
  *out << c.model << " --pp " << c.ranks << " " << c.flags;
}

std::string case_name(const testing::TestParamInfo<MemoryCase>& info) {
  std::string name = info.param.model + "_pp" + std::to_string(info.param.ranks) + "_";
  for (char c : info.param.flags) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class PredictedPeak : public testing::TestWithParam<MemoryCase> {};

TEST_P(PredictedPeak, WithinTenPercentOfTheMeasuredPeakOnEveryRank) {
  const MemoryCase& c = GetParam();
  TempDir dir;
  ModelOptions model = small_model(c.model);
  model.d_model = 64;  // activations a good share of the whole, not only the weights
  model.seq_len = 32;
  const auto metrics = dir / "m.jsonl";
  // adamw on gpt (two moments per parameter), sgd with momentum on mlp (one).
  const std::string args = model_args(model) + " --pp " + std::to_string(c.ranks) +
                           " --batch-size 32 --microbatches 8 --steps 3 --data synthetic" +
                           " --quiet --optimizer " + (c.model == "gpt" ? "adamw" : "sgd") + " " +
                           c.flags + " --metrics " + metrics.string();
  const RunResult run = run_train(args, dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream in(metrics);
  std::string text;
  int steps = 0;
  while (std::getline(in, text)) {
    const auto line = nlohmann::json::parse(text);
    const auto measured = line.at("peak_memory_bytes").get<std::vector<double>>();
    const auto predicted = line.at("predicted_peak_memory_bytes").get<std::vector<double>>();
    ASSERT_EQ(predicted.size(), measured.size());
    for (size_t r = 0; r < measured.size(); ++r) {
      EXPECT_GT(measured[r], 0);
      EXPECT_LE(std::abs(predicted[r] - measured[r]), 0.10 * measured[r])
          << "step " << line.at("step") << " rank " << r << ": predicted " << predicted[r]
          << ", measured " << measured[r];
    }
    ++steps;
  }
  EXPECT_EQ(steps, 3);
}

std::vector<MemoryCase> cases() {
  std::vector<MemoryCase> out;
  for (const std::string model : {"gpt", "mlp"}) {
    for (int ranks : {2, 4}) {
      for (const std::string flags :
           {"--schedule 1f1b", "--schedule zb-h1", "--schedule zb-v", "--schedule v-min",
            "--schedule pipedream", "--schedule chimera", "--schedule bitpipe",
            "--schedule 1f1b --dp 2 --zero 1", "--schedule 1f1b --recompute",
            "--schedule 1f1b --precision bf16", "--schedule zb-v --precision bf16",
            "--schedule 1f1b --precision bf16 --weight-casts step",
            "--schedule zb-v --precision bf16 --weight-casts step --recompute"}) {
        out.push_back({model, ranks, flags});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Memory, PredictedPeak, testing::ValuesIn(cases()), case_name);

// `pptrain plan` under a memory limit picks a plan whose measured peak fits on every rank, and
// predicts each rank's peak within 10%: the memory model's figures from a profile of the same
// model (its layers' stash, the bytes W keeps, their working memory, their parameters, the batch)
// hold for the run; at `precision`, profiled, planned and trained at it. `plan_flags` narrow the
// search; `within` is how near the planned peaks must be.
void expect_plans_fit(const std::string& precision, const std::vector<double>& limits,
                      const std::string& plan_flags = "", double within = 0.10) {
  TempDir dir;
  ModelOptions model = small_model("gpt");
  model.d_model = 64;
  model.seq_len = 32;
  const std::string profile = (dir / "prof.json").string();
  const std::string at = " --precision " + precision;
  const auto profiled = run_pptrain("profile " + model_args(model) +
                                        " --microbatch-size 4 --warmup 1 --iters 3 "
                                        "--allreduce-ranks 0 --out " +
                                        profile + at,
                                    dir);
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  for (const double limit : limits) {
    const std::string out = (dir / ("plan" + std::to_string(static_cast<int>(limit)))).string();
    const auto planned = run_pptrain("plan --profile " + profile + " --workers 4 --batch 32 " +
                                         "--optimizer adamw --memory-limit " +
                                         std::to_string(limit) + " --out " + out + at + plan_flags,
                                     dir);
    ASSERT_EQ(planned.exit_code, 0) << planned.err;
    EXPECT_EQ(planned.err, "");  // the profile's precision is the plan's: nothing to scale
    const auto metrics = dir / "m.jsonl";
    // Without --precision: the plan's is the run's.
    const auto run = run_train(model_args(model) + " --plan " + out + "/plan.json" +
                                   " --steps 3 --optimizer adamw --data synthetic" + " --metrics " +
                                   metrics.string(),
                               dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    if (precision != "fp32") {
      EXPECT_NE(run.out.find("\nprecision " + precision), std::string::npos) << run.out;
    }
    // The planner's own figure for each rank is the run's peak within 10% (its model from the
    // profile, the run's from its own step).
    std::ifstream plan_file(out + "/plan.json");
    const auto planned_peaks =
        nlohmann::json::parse(plan_file).at("winner").at("peak_bytes").get<std::vector<double>>();
    ASSERT_EQ(planned_peaks.size(), 4u);
    std::vector<double> most(4, 0);
    std::ifstream in(metrics);
    std::string text;
    while (std::getline(in, text)) {
      const auto line = nlohmann::json::parse(text);
      const auto peaks = line.at("peak_memory_bytes").get<std::vector<double>>();
      ASSERT_EQ(peaks.size(), 4u);
      for (size_t r = 0; r < peaks.size(); ++r) {
        EXPECT_LE(peaks[r], limit) << "limit " << limit << ", step " << line.at("step") << ", rank "
                                   << r << ": " << planned.out;
        most[r] = std::max(most[r], peaks[r]);
      }
    }
    for (size_t r = 0; r < most.size(); ++r) {
      EXPECT_NEAR(planned_peaks[r], most[r], within * most[r])
          << "limit " << limit << ", rank " << r << ": the plan's peak against the run's";
    }
  }
}

// Three limits, from roomy to where only recomputation fits.
TEST(PlanUnderALimit, FitsWhenRun) {
  expect_plans_fit("fp32", {4.0e6, 3.0e6, 2.5e6});
}

// At bf16 the activations are half the bytes: the same model under a limit that fp32 could meet
// only by recomputing.
TEST(PlanUnderALimit, FitsWhenRunAtBf16) {
  expect_plans_fit("bf16", {3.0e6, 2.5e6});
}

// The profile's microbatch (4 samples) scaled down to one: at bf16 a block's working memory is
// mostly its weights cast for the forward, which do not shrink with the samples
// (LayerProfile::forward_transient_fixed_bytes). Scaled as a whole, it was predicted up to 8%
// low on zb-auto with 32 microbatches, over a limit the plan was meant to meet; now within 4%
// (rank 0 within 1%; a middle rank's activations up to 7% above the plan's, which is the rest).
TEST(PlanUnderALimit, PredictsMicrobatchesSmallerThanTheProfiledOnes) {
  expect_plans_fit("bf16", {3.2e6}, " --schedules zb-auto --microbatches 32", 0.05);
}

}  // namespace
}  // namespace pptrain::e2e
