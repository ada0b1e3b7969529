#include "pptrain/device/worker_probe.h"

#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

namespace pptrain {
namespace {

// The first line of a file, or "".
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A limit file's bytes: "max" or a value past any real machine (v1 writes 2^63 rounded down to
// pages) means none.
double limit_bytes(const std::string& text) {
  if (text.empty() || text == "max") return 0;
  try {
    const double bytes = std::stod(text);
    return bytes > 0 && bytes < 1e18 ? bytes : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

double matrix_product_rate(std::chrono::milliseconds window) {
  torch::NoGradGuard no_grad;
  const auto a = torch::rand({256, 256});
  const auto b = torch::rand({256, 256});
  auto c = torch::mm(a, b);  // the BLAS loaded and warm before the clock starts
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto end = start + window;
  long products = 0;
  auto now = start;
  while (now < end) {
    for (int i = 0; i < 8; ++i) torch::mm_out(c, a, b);
    products += 8;
    now = Clock::now();
  }
  return products / std::chrono::duration<double>(now - start).count();
}

double cgroup_memory_limit_bytes() {
  // /proc/self/cgroup: "0::/PATH" (v2) or "N:memory:/PATH" among others (v1).
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    std::istringstream fields(line);
    std::string id, controllers, path;
    std::getline(fields, id, ':');
    std::getline(fields, controllers, ':');
    std::getline(fields, path);
    if (controllers.empty() && id == "0") {
      const double bytes = limit_bytes(first_line("/sys/fs/cgroup" + path + "/memory.max"));
      if (bytes > 0) return bytes;
    }
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name != "memory") continue;
      const double bytes =
          limit_bytes(first_line("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
      if (bytes > 0) return bytes;
    }
  }
  return 0;
}

}  // namespace pptrain
