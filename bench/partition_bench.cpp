// Partitioner speed: how long make_partition takes on a large chain and on a real branchy graph.
// Prints one line per case (median of a few runs) and the plan it found; no figure is asserted.
//
//   cmake --build build --target bench_partition && build/bench/bench_partition
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"

namespace {

using pptrain::Partition;
using pptrain::PartitionOptions;
using pptrain::Profile;

// Median wall time of `runs` calls, in seconds; `last` keeps the final result.
double median_seconds(const Profile& profile, const PartitionOptions& options, int runs,
                      Partition& last) {
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    last = pptrain::make_partition(profile, options);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const char* name, const Profile& profile, const PartitionOptions& options, int runs) {
  Partition part;
  double seconds = median_seconds(profile, options, runs, part);
  int workers = 0;
  for (const auto& s : part.stages) workers += s.replicas;
  std::printf("%-44s %9.4f s   %3zu stages, %3d workers, %.6f s per minibatch, speed-up %.2fx\n",
              name, seconds, part.stages.size(), workers, part.time_per_minibatch_s,
              part.speedup_vs_single);
}

Profile random_chain(int layers, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> ms(0.1, 10.0), mb(0.1, 40.0);
  Profile p;
  p.source = "random";
  for (int i = 0; i < layers; ++i) {
    p.layers.push_back({"l" + std::to_string(i), ms(rng), ms(rng), ms(rng) / 2, mb(rng) * 1e6,
                        mb(rng) * 1e6, mb(rng) * 1e6});
  }
  return p;
}

}  // namespace

int main() {
  Profile chain = random_chain(1000, 1);
  PartitionOptions time;
  time.method = "time";
  time.stages = 64;
  report("time, 1000 layers -> 64 stages", chain, time, 5);
  time.bandwidth_bytes_per_s = 10e9;
  report("time, 1000 layers -> 64 stages, 10 GB/s", chain, time, 5);
  PartitionOptions params = time;
  params.method = "params";
  params.bandwidth_bytes_per_s = 0;
  report("params, 1000 layers -> 64 stages", chain, params, 5);

  Profile resnet =
      pptrain::read_profile(std::string(PPTRAIN_SOURCE_DIR) + "/data/pipedream/resnet50/graph.txt");
  PartitionOptions pipedream;
  pipedream.method = "pipedream";
  pipedream.levels = {{16, 1e9}};
  report("pipedream, resnet50, 16 @ 1 GB/s", resnet, pipedream, 3);
  pipedream.levels = {{4, 100e9}, {4, 1e9}};
  report("pipedream, resnet50, 4 @ 100 GB/s x 4 @ 1 GB/s", resnet, pipedream, 3);
  pipedream.memory_limit_bytes = 16e9;
  report("  ... with a 16 GB per-worker memory limit", resnet, pipedream, 3);
  return 0;
}
