#include "pptrain/device/compute_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

namespace pptrain {

void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

}  // namespace pptrain
