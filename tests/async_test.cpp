// End-to-end tests of the asynchronous schedules (schedule/weight_versions.h).
//
// Their invariant: `--pp S` equals the one-process run of the same rule, `--pp 1 --stages S`,
// to 1e-5 relative in every loss and in the final parameters, for S = 2 and 4. And each is
// really asynchronous: its losses leave the synchronous run's where its rule says they must.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "pptrain/data/data.h"
#include "pptrain/models/model.h"
#include "pptrain/runtime/stage.h"
#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;

// The "weight_versions" of the last line of a --metrics file.
std::vector<int> last_weight_versions(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return nlohmann::json::parse(last).at("weight_versions").get<std::vector<int>>();
}

struct AsyncCase {
  std::string name;      // test name
  std::string schedule;  // --schedule and its flags
  // weight_versions per rank at --pp 4
  std::vector<int> versions_at_4;
  // the first step (1-based) whose loss differs from the synchronous run's, on 2 and 4 ranks
  int first_different_at_2;
  int first_different_at_4;
  int microbatches = 4;  // per step (of a batch of 8)
  int chunks = 1;        // stages per rank: --pp P runs P x chunks stages
  // How far (relative) the first stale step's loss must be from the synchronous one.
  double min_difference = 1e-4;
};

// What gtest prints for a case: its flags, not its bytes.
void PrintTo(const AsyncCase& c, std::ostream* out) {
  *out << c.schedule;
}

using Case = std::tuple<std::string, AsyncCase>;  // model kind, schedule

class AsyncMatchesItsRule : public ::testing::TestWithParam<Case> {};

TEST_P(AsyncMatchesItsRule, PipelinedEqualsOneProcessAndDiffersFromSync) {
  const auto& [kind, c] = GetParam();
  const ModelOptions model = small_model(kind);
  const int steps = 6;
  TempDir dir;
  const std::string common = model_args(model) + " --batch-size 8 --microbatches " +
                             std::to_string(c.microbatches) + " --steps " + std::to_string(steps) +
                             " --quiet";
  const auto sync =
      run_train(common + " --pp 1 --schedule 1f1b --metrics " + (dir / "sync.jsonl").string(), dir);
  ASSERT_EQ(sync.exit_code, 0) << sync.err;
  const auto sync_losses = read_losses(dir / "sync.jsonl");
  for (int stages : {2, 4}) {
    SCOPED_TRACE("--schedule " + c.schedule + " on " + std::to_string(stages) + " ranks");
    const std::string s = std::to_string(stages);
    const std::string all = std::to_string(stages * c.chunks);
    const auto ref = run_train(common + " --schedule " + c.schedule + " --pp 1 --stages " + all +
                                   " --metrics " + (dir / ("ref" + s + ".jsonl")).string() +
                                   " --save " + (dir / ("ref" + s)).string(),
                               dir);
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const auto run = run_train(common + " --schedule " + c.schedule + " --pp " + s + " --metrics " +
                                   (dir / ("pp" + s + ".jsonl")).string() + " --save " +
                                   (dir / ("pp" + s)).string(),
                               dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto losses = read_losses(dir / ("pp" + s + ".jsonl"));
    expect_same_losses(losses, read_losses(dir / ("ref" + s + ".jsonl")));
    expect_same_parameters(model, dir / ("pp" + s), dir / ("ref" + s));
    // Not secretly synchronous: equal to the synchronous run before the rule's first stale
    // step, different from it there.
    ASSERT_EQ(losses.size(), sync_losses.size());
    const int differs = stages == 2 ? c.first_different_at_2 : c.first_different_at_4;
    for (int step = 1; step < differs; ++step) {
      EXPECT_NEAR(losses[step - 1], sync_losses[step - 1], 1e-5 * std::abs(sync_losses[step - 1]))
          << "step " << step;
    }
    EXPECT_GT(std::abs(losses[differs - 1] - sync_losses[differs - 1]),
              c.min_difference * std::abs(sync_losses[differs - 1]))
        << "step " << differs << " equals the synchronous run's";
    if (stages == 4) {
      EXPECT_EQ(last_weight_versions(dir / "pp4.jsonl"), c.versions_at_4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, AsyncMatchesItsRule,
    ::testing::Combine(
        ::testing::Values("gpt", "mlp"),
        ::testing::Values(
            // A step after every microbatch: the last stage runs microbatch 1 on W^(1).
            AsyncCase{"pipedream", "pipedream", {4, 3, 2, 1}, 1, 1},
            // Microbatch i runs on W^(max(0, i-(S-1))): with 2 stages microbatch 2 of step 1
            // already runs on W^(1); with 4 stages all of step 1 (microbatches 0-3) on W^(0).
            AsyncCase{"vertical_sync", "pipedream --vertical-sync", {4, 4, 4, 4}, 1, 2},
            // Step k's gradients are taken on W^(k-1), W^(-1) = W^(0): step 1 is synchronous.
            AsyncCase{"twobw", "2bw", {2, 2, 2, 2}, 2, 2},
            // No stash: step 2's first forwards on stage 0 still run on W^(0). With 2
            // microbatches per step stage 0 of 4 is 2 steps behind, so both fixes act.
            AsyncCase{"pipemare", "pipemare", {1, 1, 1, 1}, 2, 2, 2},
            AsyncCase{"pipemare_without_fixes",
                      "pipemare --no-lr-reschedule --no-discrepancy-correction",
                      {1, 1, 1, 1},
                      2,
                      2,
                      2},
            // A step after every backward, each pass on the newest weights: microbatch 1
            // already runs on W^(1).
            AsyncCase{"ampnet", "ampnet", {1, 1, 1, 1}, 1, 1},
            // A step every 4 backwards (one per step of 4 microbatches): step 1 is synchronous,
            // step 2's first forwards on stage 0 still run on W^(0).
            AsyncCase{"ampnet_interval", "ampnet --update-interval 4", {1, 1, 1, 1}, 2, 2},
            // Two groups on every rank: step 1 is synchronous, step 2's first group still
            // runs on W^(0). Each rank holds a first-group stage, 2 versions. Only half the
            // stages are stale, which moves the mlp's step-2 loss by about 1e-4 on 4 ranks.
            AsyncCase{"wpipe", "wpipe", {2, 2, 2, 2}, 2, 2, 4, 2, 3e-5},
            // A step after every microbatch, on weights predicted along the momentum.
            AsyncCase{"spectrain", "spectrain", {2, 2, 2, 2}, 1, 1},
            // A step per mini-batch; step 1 predicts from W^(0), which has no direction yet, so
            // it is synchronous; stage 0 of 4 then runs step 2's first forwards on W^(0).
            AsyncCase{"xpipe", "xpipe", {3, 3, 3, 3}, 2, 2},
            // XPipe's own optimizer. The synchronous run it is compared with is sgd's, so it
            // differs from the first step after an update; the case is here for the equality
            // with its rule.
            AsyncCase{"xpipe_adamw", "xpipe --optimizer adamw", {3, 3, 3, 3}, 2, 2})),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
    });

// --tie-embeddings under pipedream and 2bw: the token table's copy on the first stage takes
// each update with both copies' gradients, the head's copy the same update some updates later
// (train/tied_parameters.h); pipelines equal the one-process run of that rule (which checks at
// the end that the copies are equal bit for bit), the checkpoint stores the table once, and the
// runs are not secretly synchronous.
TEST(TiedEmbeddings, AsynchronousPipelinesEqualTheirOneProcessRule) {
  ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common =
      model_args(model) + " --tie-embeddings --batch-size 8 --microbatches 4 --steps 6 --quiet";
  const auto sync =
      run_train(common + " --pp 1 --schedule 1f1b --metrics " + (dir / "sync.jsonl").string(), dir);
  ASSERT_EQ(sync.exit_code, 0) << sync.err;
  const auto sync_losses = read_losses(dir / "sync.jsonl");
  model.tie_embeddings = true;
  for (const auto& [schedule, first_stale] :
       {std::pair<std::string, int>{"pipedream", 1}, std::pair<std::string, int>{"2bw", 2}}) {
    for (int stages : {2, 4}) {
      const std::string s = std::to_string(stages), tag = schedule + s;
      SCOPED_TRACE("--schedule " + schedule + " on " + s + " ranks");
      const auto ref = run_train(common + " --schedule " + schedule + " --pp 1 --stages " + s +
                                     " --metrics " + (dir / (tag + "ref.jsonl")).string() +
                                     " --save " + (dir / (tag + "ref")).string(),
                                 dir);
      ASSERT_EQ(ref.exit_code, 0) << ref.err;
      const auto run =
          run_train(common + " --schedule " + schedule + " --pp " + s + " --metrics " +
                        (dir / (tag + ".jsonl")).string() + " --save " + (dir / tag).string(),
                    dir);
      ASSERT_EQ(run.exit_code, 0) << run.err;
      const auto losses = read_losses(dir / (tag + ".jsonl"));
      expect_same_losses(losses, read_losses(dir / (tag + "ref.jsonl")));
      expect_same_parameters(model, dir / tag, dir / (tag + "ref"));
      expect_table_stored_once(model, dir / tag, "sgd");
      ASSERT_EQ(losses.size(), sync_losses.size());
      for (int step = 1; step < first_stale; ++step) {
        EXPECT_NEAR(losses[step - 1], sync_losses[step - 1],
                    1e-5 * std::abs(sync_losses[step - 1]));
      }
      EXPECT_GT(std::abs(losses[first_stale - 1] - sync_losses[first_stale - 1]),
                1e-4 * std::abs(sync_losses[first_stale - 1]));
    }
  }
}

// 2bw's rule computed by hand, apart from the runtime's weight versions: one stage, one
// microbatch per step, plain SGD without clipping. Step k's loss is f(W^(k-1); batch k) and
// W^(k+1) = W^(k) - lr * grad f(W^(k-1); batch k), with W^(-1) = W^(0).
TEST(TwoBW, IsOneStepStaleSgd) {
  ModelOptions model = small_model("mlp");
  model.layers = 2;
  const int steps = 5;
  const double lr = 0.1;
  TempDir dir;
  const auto run = run_train(model_args(model) +
                                 " --pp 1 --schedule 2bw --batch-size 4 --microbatches 1 "
                                 "--momentum 0 --clip 0 --lr 0.1 --quiet --steps " +
                                 std::to_string(steps) + " --metrics " +
                                 (dir / "m.jsonl").string() + " --save " + (dir / "run").string(),
                             dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;

  DataOptions data;
  data.batch_size = 4;
  data.seed = model.seed;
  const Dataset dataset(model, data);
  const std::pair<int, int> all_layers{0, num_layers(model) - 1};
  Stage newest = make_stage(model, 0, all_layers);    // W^(k)
  Stage previous = make_stage(model, 0, all_layers);  // W^(k-1)
  std::vector<double> losses;
  for (int k = 0; k < steps; ++k) {
    const auto batch = dataset.batch(k);
    const torch::Tensor loss = compute_loss(model, previous.forward(batch.inputs), batch.targets);
    losses.push_back(loss.item<double>());
    const auto grads = torch::autograd::grad({loss}, previous.parameters());
    torch::NoGradGuard no_grad;
    const auto w = newest.parameters(), old = previous.parameters();
    for (size_t p = 0; p < w.size(); ++p) {
      old[p].copy_(w[p]);       // W^(k) is the next step's previous version
      w[p].sub_(grads[p], lr);  // W^(k+1)
    }
  }
  expect_same_losses(read_losses(dir / "m.jsonl"), losses);
  newest.save((dir / "hand").string());
  expect_same_parameters(model, dir / "run", dir / "hand");
}

}  // namespace
}  // namespace pptrain
