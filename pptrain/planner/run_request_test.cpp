#include "pptrain/planner/run_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pptrain/common/testing.h"

namespace pptrain {
namespace {

using testing::user_error_of;

RunRequest request_of(const std::string& schedule, int pp, int microbatches) {
  RunRequest run;
  run.schedule.schedule = schedule;
  run.schedule.pp = pp;
  run.schedule.microbatches = microbatches;
  run.optimizer = OptimizerOptions();
  return run;
}

// The error of resolving `run`, "" when it resolves.
std::string error_of(const RunRequest& run) {
  return user_error_of([&] { resolve_run(run, CostModel()); });
}

// The C++ library's names, to see that each message names the option as its caller does.
OptionNames library_names() {
  OptionNames names;
  names.schedule = "schedule";
  names.dp = "data_parallel";
  names.zero = "zero";
  names.momentum = "optimizer.momentum";
  names.optimizer = "optimizer.kind";
  names.post_validation = "optimizer.post_validation";
  names.exact_rollback = "optimizer.exact_rollback";
  return names;
}

TEST(RunRequest, TiesCountStagesBelowZeroFromTheLast) {
  RunRequest run = request_of("zb-v", 2, 4);  // 4 stages
  run.ties = {{"embedding", {-1, 0}}, {"norm", {1, 2}}};
  const ResolvedRun resolved = resolve_run(run, CostModel());
  ASSERT_EQ(resolved.ties.size(), 2u);
  EXPECT_EQ(resolved.ties[0].stages, (std::vector<int>{0, 3}));
  EXPECT_EQ(resolved.ties[1].stages, (std::vector<int>{1, 2}));
  // One stage: the first and the last are one copy.
  RunRequest one = request_of("1f1b", 1, 4);
  one.schedule.one_process = true;
  one.ties = {{"embedding", {0, -1}}};
  EXPECT_EQ(resolve_run(one, CostModel()).ties[0].stages, (std::vector<int>{0}));
}

TEST(RunRequest, TiesThatCannotRunAreRefusedNamingTheTie) {
  RunRequest run = request_of("1f1b", 2, 4);
  run.ties = {{"embedding", {0, 2}}};
  EXPECT_EQ(error_of(run),
            "tied parameter 'embedding' names stages 0, 2; give distinct stages of 0..1 (or -1 "
            "for the last)");
  run.ties = {{"embedding", {0, 1}}, {"embedding", {0, 1}}};
  EXPECT_EQ(error_of(run), "tied parameter names must be non-empty and distinct, got 'embedding'");
  run = request_of("pipemare", 2, 4);
  run.ties = {{"embedding", {0, -1}}};
  run.schedule.names.tie = "--tie-embeddings";
  EXPECT_EQ(error_of(run).rfind("--tie-embeddings: pipemare has no rule for tied parameters", 0),
            0u);
  run = request_of("chimera", 2, 4);
  run.ties = {{"embedding", {0, -1}}};
  EXPECT_EQ(error_of(run).rfind("tied parameter 'embedding': chimera is replicated", 0), 0u);
}

// Each rule of what runs with what is checked once, for every caller, in its caller's words.
TEST(RunRequest, TheOptimizersRulesNameTheOptionsAsTheCallerDoes) {
  RunRequest run = request_of("spectrain", 2, 4);
  run.optimizer->momentum = 0;
  EXPECT_EQ(error_of(run),
            "--schedule spectrain predicts weights along the optimizer's smoothed direction, "
            "which sgd with --momentum 0 does not have (use --momentum > 0 or --optimizer adamw)");
  run.schedule.names = library_names();
  EXPECT_EQ(error_of(run),
            "schedule spectrain predicts weights along the optimizer's smoothed direction, which "
            "sgd with optimizer.momentum 0 does not have (use optimizer.momentum > 0 or "
            "optimizer.kind adamw)");
  run.optimizer->momentum = 0.9;
  EXPECT_EQ(error_of(run), "");
  // The program's own optimizer: nothing of pptrain's to check.
  run.optimizer.reset();
  EXPECT_EQ(error_of(run), "");

  run = request_of("pipedream", 2, 4);
  run.schedule.names = library_names();
  run.optimizer->post_validation = true;
  EXPECT_EQ(error_of(run),
            "optimizer.post_validation: pipedream is asynchronous and steps each stage on its own "
            "norm");
  run = request_of("1f1b", 2, 4);
  run.optimizer->exact_rollback = true;
  EXPECT_EQ(error_of(run), "--exact-rollback applies to --post-validation only");
  run.optimizer->exact_rollback = false;
  run.optimizer->kind = "adamw";
  run.optimizer->momentum = 0.5;
  EXPECT_EQ(error_of(run), "--momentum is sgd's; --optimizer adamw has none");
  run.optimizer->momentum = 0.9;
  run.optimizer->lr = 0;
  EXPECT_EQ(error_of(run), "--lr must be > 0, got 0");
}

TEST(RunRequest, CopiesRulesNameTheOptionsAsTheCallerDoes) {
  RunRequest run = request_of("1f1b", 2, 4);
  run.zero = 1;
  EXPECT_EQ(error_of(run),
            "--zero 1 shards the optimizer state over the copies of the pipeline; it needs --dp 2 "
            "or more");
  run.schedule.names = library_names();
  EXPECT_EQ(error_of(run),
            "zero 1 shards the optimizer state over the copies of the pipeline; it needs "
            "data_parallel 2 or more");
  run.schedule.dp = 2;
  EXPECT_EQ(error_of(run), "");
  run = request_of("avgpipe", 2, 4);
  EXPECT_EQ(error_of(run),
            "--schedule avgpipe averages the weights of --dp D >= 2 pipelines, got --dp 1");
  run.schedule.dp = 2;
  run.zero = 1;
  EXPECT_EQ(error_of(run),
            "--zero 1 shards an optimizer the copies share; avgpipe's copies each keep their own");
}

TEST(RunRequest, SkipsRunUnderSynchronousRulesOnly) {
  // Even a skip to the next stage, which rides in the ordinary message.
  RunRequest run = request_of("pipedream", 2, 4);
  run.skips = {{"early", 0, 1}};
  run.schedule.names.skips = "skips";
  EXPECT_EQ(error_of(run),
            "skips: pipedream is asynchronous; skip connections run on synchronous schedules for "
            "now");
  // A model's skips, known once its layers are cut, are held to the same rules.
  run.skips.clear();
  ResolvedRun resolved = resolve_run(run, CostModel());
  OptionNames names;
  names.skips = "--model unet";
  EXPECT_EQ(user_error_of([&] {
              with_skips(resolved, {{"h0", 0, 1}}, names);
            }),
            "--model unet: pipedream is asynchronous; skip connections run on synchronous "
            "schedules for now");
  run = request_of("1f1b", 4, 4);
  run.skips = {{"early", 0, 2}, {"late", 1, 3}};
  resolved = resolve_run(run, CostModel());
  EXPECT_EQ(resolved.schedule.validated.given().skips, (std::vector<SkipLink>{{0, 2}, {1, 3}}));
  run.skips = {{"early", 2, 1}};
  EXPECT_EQ(error_of(run),
            "skip connection 'early' from stage 2 to stage 1: give a name and stages 0 <= from < "
            "to <= 3");
  run.skips = {{"early", 0, 2}, {"early", 0, 3}};
  EXPECT_EQ(error_of(run), "stage 0 has two skip connections named 'early'");
}

}  // namespace
}  // namespace pptrain
