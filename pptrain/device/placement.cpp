#include "pptrain/device/placement.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#if defined(PPTRAIN_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// Why `--device cuda` cannot run here, without asking CUDA; "" when a GPU may be there.
std::string cuda_absent_reason() {
  if (!built_with_cuda()) return "this build of pptrain has no CUDA code (its torch has no CUDA)";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && (std::string(visible).empty() || std::string(visible) == "-1")) {
    return "CUDA_VISIBLE_DEVICES='" + std::string(visible) + "' hides every GPU";
  }
  bool node = false;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", error)) {
    const std::string name = entry.path().filename().string();
    node = node || (name.rfind("nvidia", 0) == 0 && name.size() > 6 &&
                    std::isdigit(static_cast<unsigned char>(name[6])));
  }
  return node ? "" : "no CUDA device on this host (no /dev/nvidia0)";
}

}  // namespace

void require_cuda_present() {
  const std::string absent = cuda_absent_reason();
  PPTRAIN_CHECK(absent.empty(), "--device cuda: ", absent, "; use --device cpu or auto");
}

bool built_with_cuda() {
#if defined(PPTRAIN_CUDA)
  return true;
#else
  return false;
#endif
}

RankDevice decide_device(DeviceRequest request, int local_rank, Precision precision) {
  if (request == DeviceRequest::kCpu) return {};
  if (request == DeviceRequest::kAuto && !cuda_absent_reason().empty()) return {};
  if (request == DeviceRequest::kCuda) require_cuda_present();
  const bool available = torch::cuda::is_available();
  if (request == DeviceRequest::kAuto && !available) return {};
  PPTRAIN_CHECK(available,
                "--device cuda: no CUDA device is visible to this process; use "
                "--device cpu or auto");
  const int visible = static_cast<int>(torch::cuda::device_count());
  const int index = cuda_index_for(local_rank, visible);
  RankDevice out;
  out.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
#if defined(PPTRAIN_CUDA)
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(index);
  const std::string why =
      precision_unsupported_on_gpu(precision, properties->major, properties->minor);
  PPTRAIN_CHECK(why.empty(), "--precision ", precision_name(precision), " on cuda:", index, ": ",
                why);
  out.description = "cuda:" + std::to_string(index) + " (" + properties->name +
                    ", compute capability " + std::to_string(properties->major) + "." +
                    std::to_string(properties->minor) + ")";
#else
  (void)precision;
#endif
  return out;
}

torch::Device device_of(const torch::nn::Module& module) {
  std::optional<torch::Device> found;
  const auto look = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    if (!found) {
      found = t.device();
      return;
    }
    PPTRAIN_CHECK(*found == t.device(), "a stage's module has tensors on ", found->str(),
                  " and on ", t.device().str(),
                  ": move the whole module to one device (module->to(device))");
  };
  for (const torch::Tensor& p : module.parameters()) look(p);
  for (const torch::Tensor& b : module.buffers()) look(b);
  return found.value_or(torch::Device(torch::kCPU));
}

}  // namespace pptrain
