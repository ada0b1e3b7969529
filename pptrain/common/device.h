// Where a run asks its ranks to compute (`--device cpu|cuda|auto`), as plain data, and the pure
// rules of the decision device/placement.h takes with LibTorch: which CUDA device a rank of a
// host takes, and which precisions a GPU of a compute capability can compute in.
//
//   DeviceRequest d = parse_device("cuda", "--device");   // UserError for "tpu"
//   cuda_index_for(/*local_rank=*/3, /*visible=*/2)       // 1: ranks 1 and 3 share cuda:1
#pragma once

#include <string>

#include "pptrain/common/check.h"
#include "pptrain/common/precision.h"

namespace pptrain {

enum class DeviceRequest { kCpu, kCuda, kAuto };

inline const char* device_request_name(DeviceRequest request) {
  switch (request) {
    case DeviceRequest::kCpu:
      return "cpu";
    case DeviceRequest::kCuda:
      return "cuda";
    case DeviceRequest::kAuto:
      return "auto";
  }
  return "cpu";
}

// UserError starting with `flag` for a name that is none of cpu, cuda, auto.
inline DeviceRequest parse_device(const std::string& name, const std::string& flag) {
  for (DeviceRequest d : {DeviceRequest::kCpu, DeviceRequest::kCuda, DeviceRequest::kAuto}) {
    if (name == device_request_name(d)) return d;
  }
  throw UserError(flag + " " + name + ": expected cpu, cuda or auto");
}

// The CUDA device of the rank `local_rank` of its host among `visible` devices (> 0): its own
// while there are enough, else shared round robin (ranks that share one stage their messages
// through the host: runtime/links.h).
inline int cuda_index_for(int local_rank, int visible) {
  PPTRAIN_ASSERT(visible > 0 && local_rank >= 0, "local rank ", local_rank, " of ", visible,
                 " devices");
  return local_rank % visible;
}

// Why a GPU of compute capability major.minor cannot compute in `precision`, or "" when it can:
// bf16 needs 8.0 (Ampere) or newer, fp16 5.3.
inline std::string precision_unsupported_on_gpu(Precision precision, int major, int minor) {
  const int capability = 10 * major + minor;
  if (precision == Precision::kBf16 && capability < 80) {
    return "bf16 needs a GPU of compute capability 8.0 (Ampere) or newer, and this one has " +
           std::to_string(major) + "." + std::to_string(minor) + ": use fp16 or fp32";
  }
  if (precision == Precision::kFp16 && capability < 53) {
    return "fp16 needs a GPU of compute capability 5.3 or newer, and this one has " +
           std::to_string(major) + "." + std::to_string(minor) + ": use fp32";
  }
  return "";
}

}  // namespace pptrain
