// Microbenchmarks (google-benchmark) of what an action costs the runtime beyond its compute
// (issue 49, "The cost of an action"): the Executor (runtime/executor.h) running schedules of
// empty and of tiny actions, on one rank and on 2 ranks of this host (two processes over Gloo,
// as `pptrain train --pp 2` runs them), with each step's time split into its parts
// (StepCosts): compute, bookkeeping, posting receives, posting sends, waiting for receives
// (which holds the transfer) and waiting on sends; and the transfer alone, as a ping-pong.
//
//   empty   one layer y = x * w on [1, 1]: the least work an action with a graph can do.
//   tiny    Linear(32, 32) and tanh on [4, 32].
//
// The cases (names: what/schedule/work/...):
//   direct/<work>                 the forwards and backwards of 2 stages in a plain loop, no
//                                 executor: what the actions' work costs by itself.
//   local/<work>                  the same actions through an Executor on one rank (2 stages
//                                 handed over locally): `action_us` - direct's is bookkeeping.
//   pingpong/raw|bundle/...       2 processes, a message there and back: `one_way_us`. `raw` is
//                                 one 64-byte tensor through the Transport; `bundle` a [4, 32]
//                                 float message as the executor sends it (send_bundle,
//                                 BundleReceive: header, pack and unpack).
//   pipeline/<schedule>/<work>/M:<m>/ahead:<n>
//                                 2 processes, one stage each, a step of the schedule; counters
//                                 per compute action (`compute_us`, `bookkeep_us`) and per
//                                 message (`post_us`, `send_us`, `recv_wait_us`, `send_wait_us`),
//                                 from both ranks' StepCosts; `action_us` is the step's wall time
//                                 over one rank's compute actions.
// Every process uses one compute thread. Timings on a shared machine are noisy: run repetitions
// and read the medians (and the old and the new path side by side, in one run).
//
//   cmake --build build --target bench_executor
//   ./build/bench/bench_executor --benchmark_repetitions=5 --benchmark_report_aggregates_only
//   ./build/bench/bench_executor --steps=5 --benchmark_filter=pipeline   # a quick check
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pptrain/common/malloc.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/generators/registry.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/tensor_bundle.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"

namespace {

using namespace pptrain;
using Clock = std::chrono::steady_clock;

// Steps (or round trips) each case times; --steps=N sets it (the smoke test: a few).
int g_steps = 200;

enum class Work { kEmpty, kTiny };

const char* work_name(Work work) {
  return work == Work::kEmpty ? "empty" : "tiny";
}

// y = x * w: one multiplication forward, two backward.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { w = register_parameter("w", torch::ones({1})); }
  torch::Tensor forward(const torch::Tensor& x) { return x * w; }
  torch::Tensor w;
};
TORCH_MODULE(Scale);

Stage make_bench_stage(Work work, int index) {
  torch::manual_seed(index);
  std::vector<torch::nn::AnyModule> layers;
  if (work == Work::kEmpty) {
    layers.emplace_back(Scale());
  } else {
    layers.emplace_back(torch::nn::Linear(32, 32));
    layers.emplace_back(torch::nn::Tanh());
  }
  const int count = static_cast<int>(layers.size());
  return Stage(index, index * count, std::move(layers));
}

// `microbatches` inputs [1, 1] (empty) or [4, 32] (tiny); the loss ignores its targets.
StepData make_data(Work work, int microbatches) {
  torch::manual_seed(7);
  StepData data;
  for (int m = 0; m < microbatches; ++m) {
    const torch::Tensor x = work == Work::kEmpty ? torch::ones({1, 1}) : torch::randn({4, 32});
    data.inputs.emplace_back(x);
    data.targets.emplace_back(torch::zeros({1}));
  }
  return data;
}

BundleLossFn sum_loss() {
  return [](const TensorBundle& output, const TensorBundle&) { return output.only().sum(); };
}

void set_per_action(benchmark::State& state, const StepCosts& costs) {
  const double actions = std::max(1, costs.compute_actions);
  const double messages = std::max(1, costs.receives);
  state.counters["compute_us"] = costs.compute_s / actions * 1e6;
  state.counters["bookkeep_us"] = costs.bookkeeping_s() / actions * 1e6;
  state.counters["post_us"] = costs.post_s / messages * 1e6;
  state.counters["send_us"] = costs.send_s / std::max(1, costs.sends) * 1e6;
  state.counters["recv_wait_us"] = costs.recv_wait_s / messages * 1e6;
  state.counters["send_wait_us"] = costs.send_wait_s / std::max(1, costs.sends) * 1e6;
}

// ---- one rank ------------------------------------------------------------------------------

constexpr int kLocalMicrobatches = 8;

// A two-stage list on one rank, a microbatch at a time: 0Fm, 1Fm, 1Bm, 0Bm.
ValidatedSchedule local_schedule(int microbatches) {
  std::string csv;
  for (int m = 0; m < microbatches; ++m) {
    const std::string mb = std::to_string(m);
    csv += (m ? "," : "") + ("0F" + mb + ",1F" + mb + ",1B" + mb + ",0B" + mb);
  }
  return validate(parse_csv(csv + "\n", "local"));
}

void BM_Direct(benchmark::State& state, Work work) {
  Stage first = make_bench_stage(work, 0), second = make_bench_stage(work, 1);
  const StepData data = make_data(work, kLocalMicrobatches);
  for (auto _ : state) {
    for (int m = 0; m < kLocalMicrobatches; ++m) {
      const torch::Tensor y0 = first.forward(data.inputs[m].only());
      const torch::Tensor x1 = y0.detach().requires_grad_(true);
      const torch::Tensor loss = second.forward(x1).sum() / kLocalMicrobatches;
      loss.backward();
      y0.backward(x1.grad());
    }
  }
  state.counters["action_us"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 4 * kLocalMicrobatches,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Local(benchmark::State& state, Work work) {
  Stage first = make_bench_stage(work, 0), second = make_bench_stage(work, 1);
  ExecutorOptions options;
  options.stages = {&first, &second};
  options.loss = sum_loss();
  Executor executor(local_schedule(kLocalMicrobatches), options);
  const StepData data = make_data(work, kLocalMicrobatches);
  StepCosts costs;
  for (auto _ : state) costs += executor.run_step(data, Clock::now()).costs;
  state.counters["action_us"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 4 * kLocalMicrobatches,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  set_per_action(state, costs);
}

// ---- two processes -------------------------------------------------------------------------

// What the forked rank 1 hands back: its summed costs, or what went wrong.
struct PeerResult {
  bool ok = false;
  char error[512] = {};
  StepCosts costs;
};

// Rank 1 in a forked child that runs `body` and reports through a pipe. Killed with the
// benchmark process (PR_SET_PDEATHSIG) and by the destructor if never finished.
class Peer {
 public:
  explicit Peer(const std::function<StepCosts()>& body) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      PeerResult result;
      try {
        result.costs = body();
        result.ok = true;
      } catch (const std::exception& e) {
        std::snprintf(result.error, sizeof result.error, "%s", e.what());
      }
      const ssize_t wrote = write(fds[1], &result, sizeof result);
      _exit(wrote == static_cast<ssize_t>(sizeof result) && result.ok ? 0 : 1);
    }
    close(fds[1]);
    read_fd_ = fds[0];
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (read_fd_ >= 0) close(read_fd_);
  }

  // Waits for rank 1 to end; its costs, or std::runtime_error with its error.
  StepCosts finish() {
    PeerResult result;
    size_t got = 0;
    auto* bytes = reinterpret_cast<char*>(&result);
    while (got < sizeof result) {
      const ssize_t n = read(read_fd_, bytes + got, sizeof result - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    if (got != sizeof result) throw std::runtime_error("rank 1 ended without a result");
    if (!result.ok) throw std::runtime_error(std::string("rank 1: ") + result.error);
    return result.costs;
  }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
};

std::unique_ptr<Transport> connect_rank(int rank, int port, bool shared_memory) {
  TransportOptions options;
  options.shared_memory = shared_memory;
  options.rank = rank;
  options.world_size = 2;
  options.master_port = port;
  options.timeout = std::chrono::seconds(30);
  options.heartbeat = false;
  return connect_transport(options);
}

// Runs rank 0's part in google-benchmark's loop and rank 1's (`steps` times the same) in a
// forked child. `make_rank(rank, transport)` builds a rank's state and returns one step of it.
void two_ranks(benchmark::State& state, bool shared_memory,
               const std::function<std::function<StepCosts()>(int, Transport&)>& make_rank,
               StepCosts* summed) {
  const int port = find_free_port();
  const int64_t steps = state.max_iterations;
  try {
    Peer peer([&] {
      auto transport = connect_rank(1, port, shared_memory);
      auto step = make_rank(1, *transport);
      StepCosts costs;
      for (int i = 0; i < 3; ++i) step();  // warm-up, as rank 0
      transport->barrier();
      for (int64_t i = 0; i < steps; ++i) costs += step();
      transport->barrier();
      return costs;
    });
    auto transport = connect_rank(0, port, shared_memory);
    auto step = make_rank(0, *transport);
    StepCosts costs;
    for (int i = 0; i < 3; ++i) step();
    transport->barrier();
    for (auto _ : state) costs += step();
    transport->barrier();
    const StepCosts other = peer.finish();
    if (summed) {
      *summed = costs;
      *summed += other;
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// A message there and back between the two ranks, the receives posted ahead.
void BM_PingPong(benchmark::State& state, bool bundle, bool shared_memory) {
  two_ranks(
      state, shared_memory,
      [bundle](int rank, Transport& transport) -> std::function<StepCosts()> {
        struct Ends {
          Transport* transport;
          MessageLengths lengths;
          TensorBundle message;
          torch::Tensor raw;
          BundleReceive next;
          PendingComm next_raw;
          int rank;
          bool bundle;
          void post() {
            if (bundle) {
              next = BundleReceive(*transport, 1 - rank, 5, "the ping", lengths);
            } else {
              next_raw = transport->recv(torch::empty({64}, torch::kUInt8), 1 - rank, 5);
            }
          }
          void send() {
            PendingComm sent = bundle ? send_bundle(*transport, message, 1 - rank, 5, lengths)
                                      : transport->send(raw, 1 - rank, 5);
            sent.wait();
          }
          void receive() {
            if (bundle) {
              next.finish();
            } else {
              next_raw.wait();
            }
            post();
          }
        };
        auto ends = std::make_shared<Ends>();
        ends->transport = &transport;
        ends->message = TensorBundle(torch::randn({4, 32}));
        ends->raw = torch::zeros({64}, torch::kUInt8);
        ends->rank = rank;
        ends->bundle = bundle;
        ends->post();
        return [ends] {
          if (ends->rank == 0) {
            ends->send();
            ends->receive();
          } else {
            ends->receive();
            ends->send();
          }
          return StepCosts();
        };
      },
      nullptr);
  state.counters["one_way_us"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

struct PipelineCase {
  std::string schedule;
  Work work;
  int microbatches;
  int recv_ahead;
  bool shared_memory;
};

void BM_Pipeline(benchmark::State& state, PipelineCase c) {
  StepCosts costs;
  int compute_actions = 0;
  two_ranks(
      state, c.shared_memory,
      [c, &compute_actions](int rank, Transport& transport) -> std::function<StepCosts()> {
        ScheduleOptions schedule;
        schedule.name = c.schedule;
        schedule.ranks = 2;
        schedule.microbatches = c.microbatches;
        auto stage = std::make_shared<Stage>(make_bench_stage(c.work, rank));
        ExecutorOptions options;
        options.rank = rank;
        options.stages = {stage.get()};
        options.transport = &transport;
        options.loss = sum_loss();
        options.recv_ahead = c.recv_ahead;
        auto executor = std::make_shared<Executor>(validate(make_schedule(schedule)), options);
        auto data = std::make_shared<StepData>(make_data(c.work, c.microbatches));
        compute_actions = 0;
        for (const Action& a : executor->schedule().actions[rank]) {
          compute_actions += is_compute(a.op) ? 1 : 0;
        }
        return [stage, executor, data] { return executor->run_step(*data, Clock::now()).costs; };
      },
      &costs);
  state.counters["action_us"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * compute_actions,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  set_per_action(state, costs);
}

void register_all() {
  const auto us = benchmark::kMicrosecond;
  for (Work work : {Work::kEmpty, Work::kTiny}) {
    const std::string w = work_name(work);
    benchmark::RegisterBenchmark(("direct/" + w).c_str(), BM_Direct, work)
        ->Iterations(g_steps)
        ->Unit(us);
    benchmark::RegisterBenchmark(("local/" + w).c_str(), BM_Local, work)
        ->Iterations(g_steps)
        ->Unit(us);
  }
  // Each two-process case on Gloo's TCP and on shared memory (TransportOptions::shared_memory),
  // one after the other, so that the two see the same load.
  for (bool bundle : {false, true}) {
    for (bool shm : {false, true}) {
      const std::string name =
          std::string("pingpong/") + (bundle ? "bundle" : "raw") + "/" + (shm ? "shm" : "gloo");
      benchmark::RegisterBenchmark(name.c_str(), BM_PingPong, bundle, shm)
          ->Iterations(g_steps * 10)
          ->UseRealTime()
          ->Unit(us);
    }
  }
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    for (Work work : {Work::kEmpty, Work::kTiny}) {
      for (int m : {1, 8}) {
        for (int ahead : {4, -1}) {
          if (m == 1 && ahead != 4) continue;  // one receive per rank: nothing to post ahead
          for (bool shm : {false, true}) {
            const PipelineCase c{schedule, work, m, ahead, shm};
            const std::string name = std::string("pipeline/") + schedule + "/" + work_name(work) +
                                     "/M:" + std::to_string(m) + "/ahead:" + std::to_string(ahead) +
                                     "/" + (shm ? "shm" : "gloo");
            benchmark::RegisterBenchmark(name.c_str(), BM_Pipeline, c)
                ->Iterations(g_steps)
                ->UseRealTime()
                ->Unit(us);
          }
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) {
      g_steps = std::max(1, std::atoi(argv[i] + 8));
    } else {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  set_compute_threads(1);  // as every pipeline worker
  keep_freed_memory();     // as every pipeline worker (common/malloc.h)
  register_all();
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
