#include "pptrain/train/optimizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pptrain/train/plan_training.h"

namespace pptrain {
namespace {

TrainingPlan plan_for(const std::string& optimizer) {
  TrainOptions options;
  options.model.kind = "mlp";
  options.model.layers = 2;
  options.model.d_model = 8;
  options.data.batch_size = 4;
  options.data.microbatches = 1;
  options.optimizer = optimizer;
  return plan_training(options, /*may_profile=*/false);
}

// Fresh random gradients on every parameter of the stage.
void random_gradients(Stage& stage, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& p : stage.parameters()) p.mutable_grad() = torch::randn(p.sizes(), generator);
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                  double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = 1 + want[i].abs().max().item<double>();
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), tolerance * scale)
        << what << ", tensor " << i;
  }
}

// A step, then its undo, leaves the parameters and the optimizer's state (seen through the
// direction of its next step, which is the momentum or AdamW's m_hat / (sqrt(v_hat) + eps) +
// decay x p) where they were; and stepping again from there equals never having undone it.
TEST(StageOptimizer, UndoneStepRestoresParametersAndState) {
  for (const std::string name : {"sgd", "adamw"}) {
    for (const bool exact : {false, true}) {
      for (const int earlier_steps : {0, 3}) {  // 0: the undone step is the one that made the state
        const std::string what = name + (exact ? " exact" : " algebraic") + " after " +
                                 std::to_string(earlier_steps) + " steps";
        const TrainingPlan plan = plan_for(name);
        Stage stage = make_stage(plan.model, 0, {0, num_layers(plan.model) - 1});
        StageOptimizer optimizer(plan.optimizer, stage);
        for (int k = 0; k < earlier_steps; ++k) {
          random_gradients(stage, 10 + k);
          optimizer.step();
        }
        random_gradients(stage, 99);
        const auto params = copies(stage.parameters());
        const auto direction = optimizer.direction(stage);
        const auto state_bytes = optimizer.state_bytes();
        optimizer.step_undoably(exact);
        const auto stepped = copies(stage.parameters());
        EXPECT_GT((stepped[0] - params[0]).abs().max().item<double>(), 1e-4) << what;
        optimizer.undo_step();
        expect_close(copies(stage.parameters()), params, exact ? 0 : 1e-6, what + ", parameters");
        expect_close(optimizer.direction(stage), direction, exact ? 0 : 1e-6, what + ", state");
        EXPECT_EQ(optimizer.state_bytes(), state_bytes) << what;
        optimizer.step();  // the same gradients again
        expect_close(copies(stage.parameters()), stepped, exact ? 0 : 1e-6, what + ", redone");
      }
    }
  }
}

}  // namespace
}  // namespace pptrain
