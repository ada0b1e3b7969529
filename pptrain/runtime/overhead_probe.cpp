#include "pptrain/runtime/overhead_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/stats.h"
#include "pptrain/generators/registry.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/local_ranks.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/compare.h"

namespace pptrain {
namespace {

constexpr int kRanks = 2;
constexpr int kMicrobatches = 8;
constexpr int kWarmUp = 3;

// y = x * w: one multiplication forward, two backward; the least an action with a graph does.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { w = register_parameter("w", torch::ones({1})); }
  torch::Tensor forward(const torch::Tensor& x) { return x * w; }
  torch::Tensor w;
};
TORCH_MODULE(Scale);

// Seconds one empty forward and one empty backward take by themselves, without the executor:
// the medians of `repeats` of each, on the layer the probe's stages hold.
std::pair<double, double> direct_action_seconds(int repeats) {
  std::vector<torch::nn::AnyModule> layers;
  layers.emplace_back(Scale());
  Stage stage(0, 0, std::move(layers));
  const torch::Tensor x = torch::ones({1, 1});
  std::vector<double> forward, backward;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor loss = stage.forward(x).sum();
    const auto middle = std::chrono::steady_clock::now();
    loss.backward();
    const auto end = std::chrono::steady_clock::now();
    forward.push_back(std::chrono::duration<double>(middle - start).count());
    backward.push_back(std::chrono::duration<double>(end - middle).count());
  }
  return {median(forward), median(backward)};
}

}  // namespace

OverheadProfile measure_overheads(const OverheadProbeOptions& options) {
  PPTRAIN_CHECK(options.steps >= 1 && options.steps <= 10000,
                "the overhead probe's steps must be in [1, 10000], got ", options.steps);
  // GPipe: its sends go out back to back, so many receives find their message there (the only
  // ones that show recv_overhead), and its lists give gaps of every kind.
  const ValidatedSchedule schedule = validate(make_schedule({"gpipe", kRanks, kMicrobatches}));
  // [step][rank] the events, seconds since `origin`: one clock for both ranks.
  std::vector<std::vector<std::vector<TimelineEvent>>> events(
      options.steps, std::vector<std::vector<TimelineEvent>>(kRanks));
  const auto origin = std::chrono::steady_clock::now();
  run_local_ranks(
      kRanks,
      [&](int rank, Transport& transport) {
        std::vector<torch::nn::AnyModule> layers;
        layers.emplace_back(Scale());
        Stage stage(rank, rank, std::move(layers));
        ExecutorOptions executor_options;
        executor_options.rank = rank;
        executor_options.stages = {&stage};
        executor_options.transport = &transport;
        executor_options.loss = [](const TensorBundle& output, const TensorBundle&) {
          return output.only().sum();
        };
        Executor executor(schedule, executor_options);
        StepData data;
        for (int m = 0; m < kMicrobatches; ++m) {
          data.inputs.emplace_back(torch::ones({1, 1}));
          data.targets.emplace_back(torch::zeros({1}));
        }
        for (int i = 0; i < kWarmUp; ++i) executor.run_step(data, origin);
        for (int i = 0; i < options.steps; ++i) {
          transport.barrier();
          events[i][rank] = executor.run_step(data, origin).events;
        }
        transport.barrier();
      },
      "measuring the action overheads");

  std::vector<Timeline> steps(options.steps);
  for (int i = 0; i < options.steps; ++i) {
    steps[i].num_ranks = kRanks;
    for (const auto& rank_events : events[i]) {
      steps[i].events.insert(steps[i].events.end(), rank_events.begin(), rank_events.end());
    }
  }
  const CostModel cost = measure_costs(steps, schedule->num_stages).cost;
  // A compute event holds some of the executor's work too (finding the slot, handing tensors
  // over, reading the clocks), which a profile's layer times do not: what the empty actions'
  // events take beyond the same work done directly counts as overhead as well.
  const auto [direct_forward, direct_backward] = direct_action_seconds(options.steps * 10);
  double in_events = 0;
  for (int s = 0; s < schedule->num_stages; ++s) {
    in_events += cost.stage_forward[s] - direct_forward + cost.stage_backward[s] - direct_backward;
  }
  in_events = std::max(0.0, in_events / (2 * schedule->num_stages));
  OverheadProfile out;
  out.action_ms = (cost.action_overhead + in_events) * 1e3;
  out.send_ms = cost.send_overhead * 1e3;
  out.recv_ms = cost.recv_overhead * 1e3;
  return out;
}

}  // namespace pptrain
