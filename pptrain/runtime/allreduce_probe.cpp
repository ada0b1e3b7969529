#include "pptrain/runtime/allreduce_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/transport.h"

namespace pptrain {

NetworkProfile measure_allreduce(int ranks) {
  PPTRAIN_CHECK(ranks >= 2, "an all-reduce needs at least 2 ranks, got ", ranks);
  constexpr int kRepeats = 5;
  const std::vector<int64_t> sizes = {1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24};  // bytes
  std::vector<double> median_ms(sizes.size());                                       // rank 0's
  const int port = find_free_port();
  std::mutex failed_mutex;
  std::string failed;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        TransportOptions options;
        options.rank = rank;
        options.world_size = ranks;
        options.master_port = port;
        options.timeout = std::chrono::seconds(60);
        auto transport = connect_transport(options);
        for (size_t i = 0; i < sizes.size(); ++i) {
          auto tensor = torch::ones({sizes[i] / 4}, torch::kFloat32);
          transport->allreduce_sum(tensor);  // warm-up: connections, buffers
          std::vector<double> ms;
          for (int k = 0; k < kRepeats; ++k) {
            transport->barrier();
            const auto start = std::chrono::steady_clock::now();
            transport->allreduce_sum(tensor);
            ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
          }
          std::sort(ms.begin(), ms.end());
          if (rank == 0) median_ms[i] = ms[kRepeats / 2];
        }
        transport->barrier();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failed_mutex);
        if (failed.empty()) failed = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  PPTRAIN_CHECK(failed.empty(), "measuring the all-reduce failed: ", failed);

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
