#include "pptrain/runtime/executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"
#include "pptrain/generators/registry.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/testing.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

ModelOptions tiny_mlp() {
  ModelOptions model;
  model.kind = "mlp";
  model.layers = 4;
  model.d_model = 8;
  return model;
}

// What one training step leaves behind: its loss and every parameter's gradient.
struct StepResult {
  double loss = 0;                   // mean over the microbatches, as StepRecord::loss
  std::vector<torch::Tensor> grads;  // in the order of the model's layers and their parameters
};

// The plain way: the whole model in one stage, one graph per microbatch, loss / M, microbatches
// in order. The loss adds each microbatch's loss / M as a double, as the executor does.
StepResult reference_step(const ModelOptions& model, const StepData& data) {
  Stage whole = make_stage(model, 0, {0, num_layers(model) - 1});
  StepResult result;
  for (size_t m = 0; m < data.inputs.size(); ++m) {
    auto loss = compute_loss(model, whole.forward(data.inputs[m].only()), data.targets[m].only()) /
                static_cast<double>(data.inputs.size());
    result.loss += loss.item<double>();
    loss.backward();
  }
  for (const auto& p : whole.parameters()) result.grads.push_back(p.grad().clone());
  return result;
}

LossFn loss_of(const ModelOptions& model) {
  return [model](const torch::Tensor& output, const torch::Tensor& target) {
    return compute_loss(model, output, target);
  };
}

// `microbatches` random [rows, width] inputs and targets, from `seed`.
StepData random_step(int microbatches, int64_t rows, int64_t width, uint64_t seed) {
  torch::manual_seed(seed);
  StepData data;
  for (int m = 0; m < microbatches; ++m) {
    data.inputs.push_back(torch::randn({rows, width}));
    data.targets.push_back(torch::randn({rows, width}));
  }
  return data;
}

// An executor for rank 0 of a one-rank schedule: no messages, so no transport.
Executor make_executor(const ModelOptions& model, const Schedule& schedule,
                       std::vector<Stage*> stages, ExecutorOptions options = {}) {
  options.stages = std::move(stages);
  options.loss = bundle_loss(loss_of(model));
  return Executor(validate(schedule), options);
}

// tiny_mlp() as two stages on one rank (layers 0-1 and 2-3), run through one step of `csv` on two
// microbatches; the gradients it leaves must equal plain autograd's.
StepRecord run_two_local_stages_against_autograd(const std::string& csv,
                                                 ExecutorOptions options = {}) {
  const ModelOptions model = tiny_mlp();
  const Schedule schedule = parse_csv(csv);
  EXPECT_EQ(schedule.num_stages, 2);
  Stage first = make_stage(model, 0, {0, 1});
  Stage second = make_stage(model, 1, {2, 3});
  Executor executor = make_executor(model, schedule, {&first, &second}, options);
  const StepData data = random_step(/*microbatches=*/2, /*rows=*/2, /*width=*/8, /*seed=*/3);
  StepRecord record = executor.run_step(data, std::chrono::steady_clock::now());
  const auto want = reference_step(model, data).grads;
  size_t i = 0;
  for (Stage* stage : {&first, &second}) {
    for (const auto& p : stage->parameters()) {
      EXPECT_TRUE(p.grad().defined()) << "parameter " << i;
      if (i < want.size() && p.grad().defined()) {
        EXPECT_TRUE(torch::allclose(p.grad(), want[i], 1e-5, 1e-7)) << "parameter " << i;
      }
      ++i;
    }
  }
  EXPECT_EQ(i, want.size());
  return record;
}

// Two stages on one rank, the V placement's turn: F hands the activation over locally, I and W
// split the backward, and the gradient goes back locally. The result must equal plain autograd.
TEST(Executor, LocalStagesWithSplitBackwardMatchPlainAutograd) {
  const StepRecord record =
      run_two_local_stages_against_autograd("0F0,1F0,0F1,1F1,1I0,0I0,1B1,1W0,0B1,0W0\n");
  EXPECT_TRUE(record.has_loss);
  EXPECT_EQ(record.events.size(), 10u);
  for (const auto& event : record.events) EXPECT_LE(event.start, event.end);
}

// A composite action runs its parts in order; each part is one timeline event.
TEST(Executor, OverlappedForwardAndBackwardRunAsTheirParts) {
  const StepRecord record =
      run_two_local_stages_against_autograd("0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\n");
  ASSERT_EQ(record.events.size(), 8u);
  EXPECT_EQ(to_string(record.events[2].action), "0F1");
  EXPECT_EQ(to_string(record.events[3].action), "1B0");
}

// Recomputation: the same gradients from a forward rerun before each I or B, on a V placement
// (local hand-over both ways) with split and fused backwards.
TEST(Executor, RecomputeMatchesPlainAutograd) {
  ExecutorOptions options;
  options.recompute = true;
  const StepRecord record =
      run_two_local_stages_against_autograd("0F0,1F0,0F1,1F1,1I0,0I0,1B1,1W0,0B1,0W0\n", options);
  EXPECT_TRUE(record.has_loss);
}

// With every forward ahead of every backward (GPipe), recomputation holds M stage inputs instead
// of M autograd graphs: the step's peak of allocated bytes drops.
TEST(Executor, RecomputeLowersThePeak) {
  ModelOptions model = tiny_mlp();
  model.d_model = 64;
  const Schedule schedule = parse_csv("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n");
  install_counting_allocator();
  const StepData data = random_step(/*microbatches=*/4, /*rows=*/16, /*width=*/64, /*seed=*/4);
  int64_t peaks[2];
  for (bool recompute : {false, true}) {
    Stage whole = make_stage(model, 0, {0, num_layers(model) - 1});
    ExecutorOptions options;
    options.recompute = recompute;
    Executor executor = make_executor(model, schedule, {&whole}, options);
    for (auto& p : whole.parameters()) p.mutable_grad() = torch::zeros_like(p);
    const int64_t base = allocated_bytes();
    reset_peak();
    executor.run_step(data, std::chrono::steady_clock::now());
    peaks[recompute] = peak_bytes() - base;
  }
  EXPECT_LT(peaks[1], peaks[0] * 0.6) << "without " << peaks[0] << " B, with " << peaks[1] << " B";
}

// ---- Whole pipelines in one process: one thread per rank ----

// How a rank thread reaches the others; called on that rank's thread.
using ConnectFn = std::function<std::unique_ptr<Transport>(int rank)>;

// Long enough for any honest step of these tiny models, short enough that a deadlock fails the
// test within seconds rather than at the CTest timeout.
constexpr std::chrono::milliseconds kRankTimeout = std::chrono::seconds(5);

// Two steps of the named schedule on `ranks` ranks over 8 mlp blocks (uniformly split into the
// schedule's stages), every rank a thread of this process. Gradients are zeroed before each step,
// so the result is the second step's, which reuses the executor, its buffers plan and the tags.
// A rank that throws is reported through `errors`, as "rank r: ...".
StepResult run_pipeline(const ScheduleOptions& schedule_options, const ModelOptions& model,
                        const StepData& data, const ConnectFn& connect, std::string& errors,
                        ExecutorOptions base = {}) {
  const ValidatedSchedule schedule = validate(make_schedule(schedule_options));
  const int num_stages = schedule->num_stages;
  const auto ranges = uniform_split(model, num_stages);
  // Built here, not on the rank threads, so that each rank's threads only touch its own stages.
  std::vector<Stage> stages;
  for (int s = 0; s < num_stages; ++s) stages.push_back(make_stage(model, s, ranges[s]));
  base.loss = bundle_loss(loss_of(model));
  std::vector<double> losses(schedule->num_ranks, 0.0);
  std::vector<char> has_loss(schedule->num_ranks, 0);
  errors = testing::run_rank_threads(schedule->num_ranks, [&](int rank) {
    std::unique_ptr<Transport> transport = connect(rank);
    ExecutorOptions options = base;
    options.rank = rank;
    options.transport = transport.get();
    for (int s : schedule->stages_of(rank)) options.stages.push_back(&stages[s]);
    Executor executor(schedule, options);
    for (int step = 0; step < 2; ++step) {
      for (Stage* stage : options.stages) {
        for (auto& p : stage->parameters()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
      const StepRecord record = executor.run_step(data, std::chrono::steady_clock::now());
      losses[rank] = record.loss;
      has_loss[rank] = record.has_loss;
    }
  });
  StepResult result;
  for (int r = 0; r < schedule->num_ranks; ++r) {
    if (has_loss[r]) result.loss = losses[r];
  }
  for (const Stage& stage : stages) {
    for (const auto& p : stage.parameters()) result.grads.push_back(p.grad());
  }
  return result;
}

// A connect function handing out loopback transports of one world.
ConnectFn loopback_world(int ranks) {
  auto transports = std::make_shared<std::vector<std::unique_ptr<Transport>>>(
      make_loopback_transports(ranks, kRankTimeout));
  return [transports](int rank) { return std::move(transports->at(rank)); };
}

ModelOptions eight_block_mlp() {
  ModelOptions model = tiny_mlp();
  model.layers = 8;  // enough blocks for 4 ranks x 2 chunks
  return model;
}

// Exactly equal, not close: every schedule runs the same float operations on the same values as
// the single-process reference. Across a cut, a stage's input gradient is the sum of its two
// uses (the residual and the block), two terms whose sum does not depend on their order, and
// every schedule runs a stage's weight-gradient parts (B, or I then W) in microbatch order, as
// the reference accumulates them.
void expect_same_step(const StepResult& got, const StepResult& want) {
  EXPECT_EQ(got.loss, want.loss);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << "parameter " << i << " has no gradient";
    EXPECT_TRUE(torch::equal(got.grads[i], want.grads[i]))
        << "parameter " << i << ": largest difference "
        << (got.grads[i] - want.grads[i]).abs().max().item<float>();
  }
}

struct PipelineCase {
  std::string schedule;
  int ranks;
};

// Test listings show "zb-v on 4 ranks", not the case's bytes.
void PrintTo(const PipelineCase& c, std::ostream* out) {
  *out << c.schedule << " on " << c.ranks << " ranks";
}

class LoopbackPipeline : public ::testing::TestWithParam<PipelineCase> {};

// Every rank a thread, over the loopback transport: the loss and the gradients of a step equal
// the single-process reference's, bit for bit.
TEST_P(LoopbackPipeline, MatchesTheSingleProcessReference) {
  const PipelineCase& c = GetParam();
  const ModelOptions model = eight_block_mlp();
  const int microbatches = 2 * c.ranks;  // a multiple of P, as interleaved-1f1b needs
  const StepData data = random_step(microbatches, /*rows=*/2, model.d_model, /*seed=*/11);
  std::string errors;
  const StepResult got = run_pipeline({c.schedule, c.ranks, microbatches}, model, data,
                                      loopback_world(c.ranks), errors);
  ASSERT_EQ(errors, "");
  expect_same_step(got, reference_step(model, data));
}

INSTANTIATE_TEST_SUITE_P(Schedules, LoopbackPipeline,
                         ::testing::Values(PipelineCase{"gpipe", 2}, PipelineCase{"gpipe", 4},
                                           PipelineCase{"1f1b", 2}, PipelineCase{"1f1b", 4},
                                           PipelineCase{"interleaved-1f1b", 2},
                                           PipelineCase{"interleaved-1f1b", 4},
                                           PipelineCase{"zb-v", 2}, PipelineCase{"zb-v", 4}),
                         [](const ::testing::TestParamInfo<PipelineCase>& info) {
                           std::string name = info.param.schedule + "_" +
                                              std::to_string(info.param.ranks) + "ranks";
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// Recomputation and receives posted only when due change when things happen, not the result.
TEST(LoopbackPipelineOptions, RecomputeAndLateReceivesMatchTheReference) {
  const ModelOptions model = eight_block_mlp();
  const StepData data = random_step(/*microbatches=*/8, /*rows=*/2, model.d_model, /*seed=*/12);
  ExecutorOptions options;
  options.recompute = true;
  options.recv_ahead = 0;
  std::string errors;
  const StepResult got =
      run_pipeline({"zb-v", 4, 8}, model, data, loopback_world(4), errors, options);
  ASSERT_EQ(errors, "");
  expect_same_step(got, reference_step(model, data));
}

// The same two-rank pipeline over real Gloo (two threads of this process, a TCPStore on a free
// port) and over the loopback: the same loss and gradients.
TEST(GlooPipeline, MatchesTheLoopback) {
  const ModelOptions model = eight_block_mlp();
  const StepData data = random_step(/*microbatches=*/4, /*rows=*/2, model.d_model, /*seed=*/13);
  const ScheduleOptions schedule{"zb-v", 2, 4};
  const int port = find_free_port();
  const ConnectFn gloo = [port](int rank) {
    TransportOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.master_port = port;
    options.timeout = kRankTimeout;
    return connect_transport(options);
  };
  std::string gloo_errors, loopback_errors;
  const StepResult over_gloo = run_pipeline(schedule, model, data, gloo, gloo_errors);
  ASSERT_EQ(gloo_errors, "");
  const StepResult over_loopback =
      run_pipeline(schedule, model, data, loopback_world(2), loopback_errors);
  ASSERT_EQ(loopback_errors, "");
  expect_same_step(over_gloo, over_loopback);
}

// A rank that fails is reported by the test, and its peers give up after their timeout instead
// of hanging: here rank 1 never connects, so rank 0's first receive times out.
TEST(LoopbackPipelineOptions, AFailingRankIsReportedNotAHang) {
  const ModelOptions model = eight_block_mlp();
  const StepData data = random_step(/*microbatches=*/2, /*rows=*/2, model.d_model, /*seed=*/14);
  auto transports = std::make_shared<std::vector<std::unique_ptr<Transport>>>(
      make_loopback_transports(2, std::chrono::milliseconds(300)));
  const ConnectFn connect = [transports](int rank) -> std::unique_ptr<Transport> {
    if (rank == 1) throw std::runtime_error("rank 1 could not start");
    return std::move(transports->at(rank));
  };
  std::string errors;
  run_pipeline({"1f1b", 2, 2}, model, data, connect, errors);
  EXPECT_NE(errors.find("rank 1: rank 1 could not start"), std::string::npos) << errors;
  EXPECT_NE(errors.find("rank 0: rank 0: receive from rank 1 with tag"), std::string::npos)
      << errors;
}

TEST(Memory, CountsLiveTensorsAndThePeak) {
  install_counting_allocator();
  ASSERT_TRUE(counting_allocator_installed());
  const int64_t before = allocated_bytes();
  reset_peak();
  {
    auto a = torch::empty({1024}, torch::kFloat32);  // 4 KiB
    EXPECT_EQ(allocated_bytes() - before, 4096);
  }
  EXPECT_EQ(allocated_bytes(), before);
  EXPECT_EQ(peak_bytes() - before, 4096);
}

}  // namespace
}  // namespace pptrain
