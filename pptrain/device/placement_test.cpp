#include "pptrain/device/placement.h"

#include <gtest/gtest.h>

#include <string>

namespace pptrain {
namespace {

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceRequest, NamesParseAndOthersAreOneLine) {
  EXPECT_EQ(parse_device("cpu", "--device"), DeviceRequest::kCpu);
  EXPECT_EQ(parse_device("cuda", "--device"), DeviceRequest::kCuda);
  EXPECT_EQ(parse_device("auto", "--device"), DeviceRequest::kAuto);
  EXPECT_EQ(user_error_of([] { parse_device("gpu", "--device"); }),
            "--device gpu: expected cpu, cuda or auto");
}

// Ranks of a host take a device each while there are enough, then share them round robin.
TEST(DeviceRequest, LocalRanksTakeTheirOwnDeviceThenShare) {
  EXPECT_EQ(cuda_index_for(0, 8), 0);
  EXPECT_EQ(cuda_index_for(5, 8), 5);
  EXPECT_EQ(cuda_index_for(1, 1), 0);  // two ranks on a one-GPU machine share cuda:0
  EXPECT_EQ(cuda_index_for(3, 2), 1);
}

TEST(DeviceRequest, APrecisionTheGpuCannotComputeInIsNamed) {
  EXPECT_EQ(precision_unsupported_on_gpu(Precision::kBf16, 9, 0), "");  // H100, H200
  EXPECT_EQ(precision_unsupported_on_gpu(Precision::kBf16, 8, 0), "");  // A100
  EXPECT_EQ(precision_unsupported_on_gpu(Precision::kBf16, 7, 5),
            "bf16 needs a GPU of compute capability 8.0 (Ampere) or newer, and this one has 7.5: "
            "use fp16 or fp32");
  EXPECT_EQ(precision_unsupported_on_gpu(Precision::kFp16, 7, 0), "");
  EXPECT_NE(precision_unsupported_on_gpu(Precision::kFp16, 5, 2), "");
  EXPECT_EQ(precision_unsupported_on_gpu(Precision::kFp32, 3, 0), "");
}

TEST(DecideDevice, CpuIsAlwaysTheCpuAndAutoFallsBackToIt) {
  EXPECT_EQ(decide_device(DeviceRequest::kCpu, 0, Precision::kBf16).device, torch::kCPU);
  EXPECT_EQ(decide_device(DeviceRequest::kCpu, 0, Precision::kBf16).description, "cpu");
  const RankDevice automatic = decide_device(DeviceRequest::kAuto, 0, Precision::kFp32);
  EXPECT_EQ(automatic.device.is_cuda(), built_with_cuda() && torch::cuda::is_available());
}

TEST(DecideDevice, CudaWithoutADeviceIsOneLine) {
  if (built_with_cuda() && torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  const std::string error =
      user_error_of([] { decide_device(DeviceRequest::kCuda, 0, Precision::kFp32); });
  EXPECT_EQ(error.find("--device cuda: "), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

// The runtime's CUDA code is compiled in exactly when its torch has CUDA: a build that lost it
// (a broken configure, a flag dropped) fails here, on a machine without a GPU too.
TEST(Build, CudaCodeIsCompiledInWhenTorchHasCuda) {
  const std::string torch_cuda = PPTRAIN_TORCH_CUDA_VERSION;
  EXPECT_EQ(built_with_cuda(), !torch_cuda.empty()) << "torch's CUDA: '" << torch_cuda << "'";
}

TEST(DeviceOf, AModuleIsWhereItsTensorsAreAndAnEmptyOneOnTheCpu) {
  torch::nn::Linear linear(3, 2);
  EXPECT_EQ(device_of(*linear), torch::kCPU);
  torch::nn::Sequential empty;
  EXPECT_EQ(device_of(*empty), torch::kCPU);
}

}  // namespace
}  // namespace pptrain
