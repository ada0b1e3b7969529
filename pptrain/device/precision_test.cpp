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

}  // namespace
}  // namespace pptrain
