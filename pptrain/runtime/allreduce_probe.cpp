#include "pptrain/runtime/allreduce_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/local_ranks.h"

namespace pptrain {

NetworkProfile measure_allreduce(int ranks) {
  PPTRAIN_CHECK(ranks >= 2, "an all-reduce needs at least 2 ranks, got ", ranks);
  constexpr int kRepeats = 5;
  const std::vector<int64_t> sizes = {1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24};  // bytes
  std::vector<double> median_ms(sizes.size());                                       // rank 0's
  run_local_ranks(
      ranks,
      [&](int rank, Transport& transport) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          auto tensor = torch::ones({sizes[i] / 4}, torch::kFloat32);
          transport.allreduce_sum(tensor);  // warm-up: connections, buffers
          std::vector<double> ms;
          for (int k = 0; k < kRepeats; ++k) {
            transport.barrier();
            const auto start = std::chrono::steady_clock::now();
            transport.allreduce_sum(tensor);
            ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
          }
          std::sort(ms.begin(), ms.end());
          if (rank == 0) median_ms[i] = ms[kRepeats / 2];
        }
        transport.barrier();
      },
      "measuring the all-reduce");

  // Least squares of ms = latency + slope x (2(r-1)/r x bytes).
  const double factor = 2.0 * (ranks - 1) / ranks;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double x = factor * static_cast<double>(sizes[i]);
    sx += x;
    sy += median_ms[i];
    sxx += x * x;
    sxy += x * median_ms[i];
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);  // ms per byte
  NetworkProfile network;
  network.ranks = ranks;
  network.bandwidth_bytes_per_s = slope > 0 ? 1000.0 / slope : 0;
  network.latency_ms = std::max(0.0, (sy - slope * sx) / n);
  PPTRAIN_CHECK(network.measured(), "measuring the all-reduce gave no usable bandwidth");
  return network;
}

}  // namespace pptrain
