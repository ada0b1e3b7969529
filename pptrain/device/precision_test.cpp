#include "pptrain/device/precision.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

TEST(Precision, NamesParseAndOthersAreOneLineErrors) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    EXPECT_EQ(parse_precision(precision_name(p), "--precision"), p);
  }
  try {
    parse_precision("fp8", "--precision");
    FAIL() << "fp8 was taken";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "--precision fp8: expected fp32, bf16 or fp16");
  }
  EXPECT_EQ(activation_element_bytes(Precision::kFp32), 4);
  EXPECT_EQ(activation_element_bytes(Precision::kBf16), 2);
  EXPECT_FALSE(compute_dtype(Precision::kFp32).has_value());
  EXPECT_EQ(compute_dtype(Precision::kFp16), c10::kHalf);
}

TEST(AutocastScope, ComputesInItsDtypeAndRestoresWhatItFound) {
  const torch::Tensor x = torch::randn({4, 8}), w = torch::randn({3, 8});
  EXPECT_FALSE(active_compute_dtype().has_value());
  {
    AutocastScope bf16(c10::kBFloat16);
    EXPECT_EQ(torch::linear(x, w).scalar_type(), c10::kBFloat16);
    EXPECT_EQ(active_compute_dtype(), c10::kBFloat16);
    {
      AutocastScope off(std::nullopt);  // a loss inside a forward's scope
      EXPECT_EQ(torch::linear(x, w).scalar_type(), c10::kFloat);
      EXPECT_FALSE(active_compute_dtype().has_value());
    }
    EXPECT_EQ(active_compute_dtype(), c10::kBFloat16);
  }
  EXPECT_EQ(torch::linear(x, w).scalar_type(), c10::kFloat);
  EXPECT_FALSE(active_compute_dtype().has_value());
}

// Autocast caches its casts of leaf parameters; a step changes them in place between two
// forwards, which must then see the new values.
TEST(AutocastScope, AForwardAfterAnUpdateSeesTheNewWeights) {
  const torch::Tensor x = torch::randn({4, 8});
  torch::Tensor w = torch::randn({3, 8}).requires_grad_();
  torch::Tensor before;
  {
    AutocastScope scope(c10::kBFloat16);
    before = torch::linear(x, w).to(torch::kFloat);
  }
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  AutocastScope scope(c10::kBFloat16);
  const torch::Tensor after = torch::linear(x, w).to(torch::kFloat);
  EXPECT_TRUE(torch::allclose(after, 2 * before, 1e-2, 1e-2)) << after << before;
}

// In a step's scope each parameter is cast once, at its first use, and every later use (another
// microbatch's forward scope) gets that copy; the copies go when the step ends, so the next
// step casts the updated weights.
TEST(StepCasts, CastEachParameterOnceUntilTheStepEnds) {
  torch::Tensor w = torch::randn({3, 8}).requires_grad_();
  EXPECT_FALSE(step_cast(w, c10::kBFloat16).defined()) << "outside a step";
  torch::Tensor first, second;
  {
    const StepCasts step(c10::kBFloat16);
    EXPECT_TRUE(step_casts_open());
    {
      AutocastScope microbatch(c10::kBFloat16);
      first = step_cast(w, c10::kBFloat16);
    }
    {
      const StepCasts inner(c10::kBFloat16);  // changes nothing, and its end drops nothing
    }
    EXPECT_TRUE(step_casts_open());
    {
      AutocastScope microbatch(c10::kBFloat16);
      torch::NoGradGuard no_grad;  // as in a custom Function's forward
      second = step_cast(w, c10::kBFloat16);
    }
  }
  EXPECT_FALSE(step_casts_open());
  ASSERT_TRUE(first.defined());
  EXPECT_EQ(first.scalar_type(), c10::kBFloat16);
  EXPECT_EQ(first.unsafeGetTensorImpl(), second.unsafeGetTensorImpl()) << "cast twice";
  EXPECT_TRUE(second.requires_grad()) << "the copy lost the parameter's history";
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  const StepCasts next(c10::kBFloat16);
  AutocastScope microbatch(c10::kBFloat16);
  const torch::Tensor after = step_cast(w, c10::kBFloat16);
  EXPECT_NE(after.unsafeGetTensorImpl(), first.unsafeGetTensorImpl());
  EXPECT_TRUE(torch::equal(after, (2 * first.detach().to(torch::kFloat)).to(c10::kBFloat16)));
}

TEST(StepCasts, Fp32CastsNothing) {
  const StepCasts none(std::nullopt);
  EXPECT_FALSE(step_casts_open());
  EXPECT_FALSE(step_cast(torch::randn({2}).requires_grad_(), c10::kBFloat16).defined());
}

}  // namespace
}  // namespace pptrain
