#include "pptrain/device/kernels.h"

#include <gtest/gtest.h>

#include <string>

namespace pptrain {
namespace {

TEST(ComputeKernels, NamesTheWheelsBlasOneDnnAndCapability) {
  const std::string config =
      "PyTorch built with:\n"
      "  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605\n"
      "  - Intel(R) MKL-DNN v3.10.2 (Git Hash f1d4719)\n"
      "  - CPU capability usage: AVX512\n"
      "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl\n";
  EXPECT_EQ(compute_kernels_line(config, "2.11.0"),
            "kernels: MKL 2024.2 (matrix products), oneDNN 3.10.2, ATen AVX512; torch 2.11.0");
}

TEST(ComputeKernels, ABlasOtherThanMklIsNamedAsTheBuildNamesIt) {
  const std::string config = "  - CPU capability usage: AVX2\n  - Build settings: BLAS_INFO=open\n";
  EXPECT_EQ(compute_kernels_line(config, "2.15.0"),
            "kernels: open (matrix products), ATen AVX2; torch 2.15.0");
  EXPECT_EQ(compute_kernels_line("", "2.15.0"),
            "kernels: ATen's own (matrix products); torch 2.15.0");
}

TEST(ComputeKernels, ThisProcessesLineNamesItsTorch) {
  EXPECT_EQ(compute_kernels_line().rfind("kernels: ", 0), 0u);
  EXPECT_NE(compute_kernels_line().find("; torch "), std::string::npos);
}

}  // namespace
}  // namespace pptrain
