#include "pptrain/device/kernels.h"

#include <ATen/Version.h>
#include <torch/version.h>

#include <regex>
#include <string>

namespace pptrain {
namespace {

// The first group of `pattern` in `text`, or "".
std::string first_match(const std::string& text, const std::string& pattern) {
  std::smatch found;
  return std::regex_search(text, found, std::regex(pattern)) ? found[1].str() : std::string();
}

}  // namespace

std::string compute_kernels_line(const std::string& config, const std::string& torch_version) {
  std::string blas = first_match(config, "BLAS_INFO=([A-Za-z0-9_]+)");
  const std::string mkl = first_match(config, "Math Kernel Library Version ([0-9.]+)");
  if (blas == "mkl" && !mkl.empty()) blas = "MKL " + mkl;
  if (blas.empty()) blas = "ATen's own";
  std::string line = "kernels: " + blas + " (matrix products)";
  const std::string dnnl = first_match(config, "MKL-DNN v([0-9.]+)");
  if (!dnnl.empty()) line += ", oneDNN " + dnnl;
  // The instruction set of ATen's vectorized kernels on this CPU (ATEN_CPU_CAPABILITY lowers it).
  const std::string capability = first_match(config, "CPU capability usage: ([A-Za-z0-9_]+)");
  if (!capability.empty()) line += ", ATen " + capability;
  return line + "; torch " + torch_version;
}

const std::string& compute_kernels_line() {
  static const std::string line = compute_kernels_line(at::show_config(), TORCH_VERSION);
  return line;
}

}  // namespace pptrain
