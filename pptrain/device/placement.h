// Where this rank computes, decided in one place (`--device cpu|cuda|auto`, the C++ and Python
// `device` options): the rest of the runtime asks the result, never torch::cuda itself.
//
//   RankDevice d = decide_device(DeviceRequest::kAuto, /*local_rank=*/1, Precision::kBf16);
//   d.device        // cuda:1 on a host of two GPUs, cuda:0 on one (shared), cpu without any
//   d.description   // "cuda:1 (NVIDIA H200, compute capability 9.0)"
//
// What runs on the device: the stages' parameters, gradients and optimizer state, the batch's
// microbatches, every forward and backward. What stays on the host: the messages between ranks
// (a message is packed into host memory and unpacked there, then moved to the device:
// runtime/links.h's host staging), checkpoints (written from host copies, so a checkpoint of a
// GPU run resumes on a CPU and back) and the reports.
#pragma once

#include <torch/torch.h>

#include <string>

#include "pptrain/common/device.h"
#include "pptrain/common/precision.h"

namespace pptrain {

struct RankDevice {
  torch::Device device = torch::kCPU;
  std::string description = "cpu";
};

// The device for `request` on the rank `local_rank` of its host (cuda_index_for among the visible
// devices). UserError in one line when CUDA is asked for and this build or this process has none
// (naming CUDA_VISIBLE_DEVICES when it is set), and when `precision` cannot be computed on the
// device chosen (common/device.h: precision_unsupported_on_gpu).
RankDevice decide_device(DeviceRequest request, int local_rank, Precision precision);

// UserError in one line (starting "--device cuda: ") when `--device cuda` cannot run here, found
// without initialising CUDA (a process that forks its workers must not: their CUDA would fail):
// this build has no CUDA code, the host has no NVIDIA device node (/dev/nvidia0, ...), or
// CUDA_VISIBLE_DEVICES hides them all. Passing it, a GPU may be there: decide_device, in the
// worker, then asks CUDA itself.
void require_cuda_present();

// The device a program's own module is on: its first parameter's (or buffer's), the CPU when it
// has neither. UserError naming both when its tensors are on two devices.
torch::Device device_of(const torch::nn::Module& module);

// Whether the runtime was compiled with its CUDA code (PPTRAIN_CUDA).
bool built_with_cuda();

}  // namespace pptrain
