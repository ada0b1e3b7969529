// Which kernels compute this process's tensor work, as one line for a run's header and for
// `pptrain profile`: torch's wheel brings its own (on x86-64, MKL for matrix products, oneDNN,
// and ATen's vectorized kernels at the CPU capability it detected), so pptrain chooses none; it
// says which ran, since figures of runs compare only with runs of the same kernels.
//
//   std::printf("%s\n", compute_kernels_line().c_str());
//   // kernels: MKL 2024.2 (matrix products), oneDNN 3.10.2, ATen AVX512; torch 2.11.0
#pragma once

#include <string>

namespace pptrain {

// The line above for this process, read once from LibTorch's configuration (at::show_config(),
// which names the CPU capability ATen dispatches to).
const std::string& compute_kernels_line();

// The same from the text of at::show_config() and torch's version.
std::string compute_kernels_line(const std::string& config, const std::string& torch_version);

}  // namespace pptrain
