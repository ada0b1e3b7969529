#include "pptrain/train/tied_parameters.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/testing.h"

namespace pptrain {
namespace {

constexpr int kUpdates = 6;
constexpr int kLag = 2;

// The gradient stage `stage` computes for the tied parameter in update u: distinct values, so
// a sum taken in the wrong update or from the wrong stage shows.
torch::Tensor gradient(int stage, int u) {
  return torch::tensor({1.0F + u, 10.0F * (stage + 1) - u}, torch::kFloat32);
}

double rate(int u) {
  return 0.01 * (u + 1);
}

// The rule by hand, plain SGD: W_(u+1) = W_u - rate(u) x (g0_u + g1_u). The first copy holds
// W_(u+1) after its update u; the other holds W_(u+1-lag) after its update u, and W_kUpdates
// after finish_async().
std::vector<torch::Tensor> by_hand() {
  std::vector<torch::Tensor> w = {torch::zeros({2})};
  for (int u = 0; u < kUpdates; ++u) {
    w.push_back(w.back() - rate(u) * (gradient(0, u) + gradient(1, u)));
  }
  return w;
}

OptimizerOptions plain_sgd() {
  OptimizerOptions options;
  options.momentum = 0;
  return options;
}

// One update of the copy on `stage` as AsyncUpdates takes it: its gradient, the hook, the
// stage's own step (plain SGD as torch takes it, on the parameter when its gradient is
// defined), the hook.
void take_update(TiedParameters& tied, int stage, int u, torch::Tensor& copy) {
  torch::NoGradGuard no_grad;
  copy.mutable_grad() = gradient(stage, u);
  tied.before_async_step(stage, u);
  if (stage == 0) {
    EXPECT_TRUE(torch::equal(copy.grad(), gradient(0, u) + gradient(1, u))) << "update " << u;
    copy.add_(copy.grad(), -rate(u));
  } else {
    EXPECT_FALSE(copy.grad().defined()) << "the stage's own step must pass the copy by";
  }
  tied.after_async_step(stage, u, /*stepped=*/true);
  EXPECT_TRUE(copy.grad().defined());
}

// The copies on two ranks: the first takes each update with both gradients, the other the same
// update kLag updates later, and both end equal to the rule by hand.
TEST(TiedParametersAsync, TheOtherCopyFollowsTheFirstByTheLag) {
  const auto want = by_hand();
  const OptimizerOptions sgd = plain_sgd();
  auto transports = make_loopback_transports(2, std::chrono::milliseconds(5000));
  const std::string errors = testing::run_rank_threads(2, [&](int stage) {
    torch::Tensor copy = torch::zeros({2});
    TiedParameters tied(
        std::vector<TiedCopies>{{"w", {0, 1}, {{stage, copy}}, transports[stage].get(), {0, 1}}});
    tied.use_asynchronously(sgd, kLag, rate);
    for (int u = 0; u < kUpdates; ++u) {
      take_update(tied, stage, u, copy);
      const int taken = stage == 0 ? u + 1 : std::max(0, u + 1 - kLag);
      EXPECT_TRUE(torch::allclose(copy, want[taken], 0, 1e-6))
          << "stage " << stage << " after update " << u;
    }
    tied.finish_async(kUpdates - 1);
    EXPECT_TRUE(torch::allclose(copy, want[kUpdates], 0, 1e-6)) << "stage " << stage;
  });
  EXPECT_EQ(errors, "");
}

// The one-process run of the rule: both copies on one rank, the later stage's update first (as
// a microbatch's backward runs), the same numbers bit for bit as two ranks.
TEST(TiedParametersAsync, OneRankHoldingBothCopiesTakesTheSameUpdates) {
  const OptimizerOptions sgd = plain_sgd();
  torch::Tensor first = torch::zeros({2}), other = torch::zeros({2});
  TiedParameters tied(
      std::vector<TiedCopies>{{"w", {0, 1}, {{0, first}, {1, other}}, nullptr, {}}});
  tied.use_asynchronously(sgd, kLag, rate);
  for (int u = 0; u < kUpdates; ++u) {
    take_update(tied, 1, u, other);
    take_update(tied, 0, u, first);
  }
  tied.finish_async(kUpdates - 1);
  EXPECT_TRUE(torch::equal(first, other));
  EXPECT_TRUE(torch::allclose(first, by_hand()[kUpdates], 0, 1e-6));
}

// A first copy that skipped an update (its stage's norm was not finite): the other skips it too.
TEST(TiedParametersAsync, AnUpdateTheFirstCopySkippedIsSkippedByTheOthers) {
  const OptimizerOptions sgd = plain_sgd();
  torch::Tensor first = torch::zeros({2}), other = torch::zeros({2});
  TiedParameters tied(
      std::vector<TiedCopies>{{"w", {0, 1}, {{0, first}, {1, other}}, nullptr, {}}});
  tied.use_asynchronously(sgd, 1, rate);
  torch::NoGradGuard no_grad;
  for (auto* copy : {&other, &first}) {
    const int stage = copy == &first ? 0 : 1;
    copy->mutable_grad() = gradient(stage, 0);
    tied.before_async_step(stage, 0);
    tied.after_async_step(stage, 0, /*stepped=*/false);
  }
  tied.finish_async(0);
  EXPECT_TRUE(torch::equal(other, torch::zeros({2})));
  EXPECT_TRUE(torch::equal(first, other));
}

}  // namespace
}  // namespace pptrain
