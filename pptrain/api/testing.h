// Shared by the library's tests: what a training run leaves behind, and the comparison of a
// pipelined run with the one-process run it must reproduce.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace pptrain::testing {

struct Trained {
  std::vector<double> losses;          // per step
  std::vector<torch::Tensor> weights;  // after the steps, in the model's order
};

// One process, no pipeline: `steps` steps of SGD (lr 0.1) on `parameters`, each on the mean of
// M microbatch losses, loss_of(step, m) / M accumulated microbatch by microbatch as a pipeline
// accumulates them.
inline Trained train_in_one_process(const std::vector<torch::Tensor>& parameters, int steps,
                                    int microbatches,
                                    const std::function<torch::Tensor(int, int)>& loss_of) {
  torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(0.1));
  Trained result;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    double loss = 0;
    for (int m = 0; m < microbatches; ++m) {
      torch::Tensor l = loss_of(step, m) / microbatches;
      loss += l.item<double>();
      l.backward();
    }
    optimizer.step();
    result.losses.push_back(loss);
  }
  for (const auto& p : parameters) result.weights.push_back(p.detach().clone());
  return result;
}

// Losses and weights equal to 1e-5 relative (weights: to 1e-5 of 1 + their largest value).
inline void expect_equal(const Trained& got, const Trained& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what;
  }
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (size_t i = 0; i < want.weights.size(); ++i) {
    const double diff = (got.weights[i] - want.weights[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * (1 + want.weights[i].abs().max().item<double>())) << what << " w" << i;
  }
}

}  // namespace pptrain::testing
