#include "pptrain/runtime/executor.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"
#include "pptrain/runtime/stage.h"
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

// Gradients of the whole model, computed the plain way: one graph per microbatch, loss / M.
std::vector<torch::Tensor> reference_grads(const ModelOptions& model,
                                           const std::vector<torch::Tensor>& inputs,
                                           const std::vector<torch::Tensor>& targets) {
  Stage whole = make_stage(model, 0, {0, num_layers(model) - 1});
  for (size_t m = 0; m < inputs.size(); ++m) {
    auto loss = compute_loss(model, whole.forward(inputs[m]), targets[m]) /
                static_cast<double>(inputs.size());
    loss.backward();
  }
  std::vector<torch::Tensor> grads;
  for (const auto& p : whole.parameters()) grads.push_back(p.grad().clone());
  return grads;
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
                       std::vector<Stage*> stages,
                       std::vector<std::vector<int64_t>> boundary_shapes,
                       ExecutorOptions options = {}) {
  options.stages = std::move(stages);
  options.loss = [model](const torch::Tensor& out, const torch::Tensor& target) {
    return compute_loss(model, out, target);
  };
  options.boundary_shapes = std::move(boundary_shapes);
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
  Executor executor = make_executor(model, schedule, {&first, &second}, {{2, 8}}, options);
  const StepData data = random_step(/*microbatches=*/2, /*rows=*/2, /*width=*/8, /*seed=*/3);
  StepRecord record = executor.run_step(data, std::chrono::steady_clock::now());
  const auto want = reference_grads(model, data.inputs, data.targets);
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
    Executor executor = make_executor(model, schedule, {&whole}, {}, options);
    for (auto& p : whole.parameters()) p.mutable_grad() = torch::zeros_like(p);
    const int64_t base = allocated_bytes();
    reset_peak();
    executor.run_step(data, std::chrono::steady_clock::now());
    peaks[recompute] = peak_bytes() - base;
  }
  EXPECT_LT(peaks[1], peaks[0] * 0.6) << "without " << peaks[0] << " B, with " << peaks[1] << " B";
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
