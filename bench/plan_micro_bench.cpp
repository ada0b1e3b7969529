// Microbenchmarks (google-benchmark) of the planner's passes over a schedule at scale: the
// generator (make_schedule), the validator (validate of the lowered schedule, whose messages it
// checks too, and of the compute-only one), the simulator (its figures of the compute-only
// schedule, and its timeline of the lowered one) and the memory model (its walk, and a prediction
// from it), for 1f1b and zb-v at P = 8 .. 256 ranks with M = 8P microbatches. Each reports its time
// and `actions/s`, compute actions per second: a pass that is linear in the schedule's size keeps
// that rate constant as P grows (issue 31 asks for within 1.5x from P = 32 to 256).
//
// The rates at P = 256 are below those of `pptrain schedule`, which puts its heap in huge pages
// (common/malloc.h): here the heap is in 4 KiB pages, beside the schedules kept for the other
// benchmarks (200 MB at P = 256). GLIBC_TUNABLES=glibc.malloc.hugetlb=1 before the run gives
// glibc's heap huge pages (validate_given/zb_v/256 125 -> 102 ms, simulate_figures 136 -> 111).
//
//   cmake --build build --target bench_plan_micro
//   ./build/bench/bench_plan_micro                                  # every case, a few minutes
//   ./build/bench/bench_plan_micro --benchmark_filter='zb_v/64/'     # one schedule and size
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/memory_model.h"
#include "pptrain/sim/simulator.h"

namespace {

using namespace pptrain;

ScheduleOptions options_for(const std::string& name, int ranks) {
  ScheduleOptions options;
  options.name = name;
  options.ranks = ranks;
  options.microbatches = 8 * ranks;
  return options;
}

int64_t compute_actions(const Schedule& schedule) {
  int64_t n = 0;
  for (const auto& rank : schedule.actions) {
    for (const Action& a : rank) n += is_compute(a.op) ? 1 : 0;
  }
  return n;
}

// The inputs of a pass are made once per (schedule, P) and kept, so that the passes are timed
// alone and the largest ones are not rebuilt for every benchmark.
struct Prepared {
  Schedule schedule;
  Schedule lowered;
  ValidatedSchedule validated;        // of the lowered schedule
  ValidatedSchedule validated_given;  // of the compute-only one, as `schedule` validates it
  int64_t actions;
};

const Prepared& prepared(const std::string& name, int ranks) {
  static std::map<std::pair<std::string, int>, Prepared> cache;
  const auto key = std::make_pair(name, ranks);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Schedule schedule = make_schedule(options_for(name, ranks));
    Schedule lowered = lower(schedule);
    ValidatedSchedule validated = validate(lowered);
    ValidatedSchedule validated_given = validate(schedule);
    const int64_t actions = compute_actions(schedule);
    it = cache
             .emplace(key, Prepared{std::move(schedule), std::move(lowered), std::move(validated),
                                    std::move(validated_given), actions})
             .first;
  }
  return it->second;
}

void report(benchmark::State& state, int64_t actions) {
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["actions/s"] =
      benchmark::Counter(static_cast<double>(actions) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void generate(benchmark::State& state, const std::string& name) {
  const ScheduleOptions options = options_for(name, static_cast<int>(state.range(0)));
  int64_t actions = 0;
  for (auto _ : state) {
    Schedule schedule = make_schedule(options);
    actions = compute_actions(schedule);
    benchmark::DoNotOptimize(schedule);
  }
  report(state, actions);
}

void validate_lowered(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    ValidatedSchedule validated = validate(p.lowered);
    benchmark::DoNotOptimize(validated);
  }
  report(state, p.actions);
}

// The compute-only schedule as `pptrain schedule` validates it (no messages to check; as in
// validate_lowered, the copy of the lists validate() takes is timed too).
void validate_given(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    ValidatedSchedule validated = validate(p.schedule);
    benchmark::DoNotOptimize(validated);
  }
  report(state, p.actions);
}

// The figures only (no timeline) of the compute-only schedule, as `pptrain schedule --json` asks.
void simulate_figures(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  const CostModel cost = CostModel::parse("F=1,I=1,W=1,comm=0");
  for (auto _ : state) {
    SimResult result = simulate(p.validated_given, cost, VersionRule{}, Record::kFigures);
    benchmark::DoNotOptimize(result);
  }
  report(state, p.actions);
}

void simulate_validated(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  const CostModel cost = CostModel::parse("F=1,I=1,W=1,comm=0");
  for (auto _ : state) {
    SimResult result = simulate(p.validated, cost);
    benchmark::DoNotOptimize(result);
  }
  report(state, p.actions);
}

// The memory model's two passes: its walk of the lowered lists (once per schedule), and a
// prediction from the walk (once per candidate's stage bytes).
void memory_walk(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    MemoryWalk walk(p.validated);
    benchmark::DoNotOptimize(walk);
  }
  report(state, p.actions);
}

// The walk as the planner makes it: of a compute-only schedule just validated, whose lowered form
// the walk reads (the validation and, when the walk needs it, the lowering are timed too).
void memory_walk_given(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    ValidatedSchedule validated = validate(p.schedule);
    MemoryWalk walk(validated);
    benchmark::DoNotOptimize(walk);
  }
  report(state, p.actions);
}

void predict_from_walk(benchmark::State& state, const std::string& name) {
  const Prepared& p = prepared(name, static_cast<int>(state.range(0)));
  const MemoryWalk walk(p.validated);
  std::vector<StageBytes> stages(p.schedule.num_stages);
  for (StageBytes& stage : stages) {
    stage.activation = 4e6;
    stage.weight_stash = 1e6;
    stage.transient = 2e6;
    stage.message = 1e6;
  }
  for (auto _ : state) {
    std::vector<RankMemory> memory = predict_memory(walk, stages);
    benchmark::DoNotOptimize(memory);
  }
  report(state, p.actions);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int ranks = 8; ranks <= 256; ranks *= 2) b->Arg(ranks);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(generate, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(generate, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(validate_lowered, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(validate_lowered, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(validate_given, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(validate_given, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(simulate_figures, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(simulate_figures, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(simulate_validated, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(simulate_validated, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(memory_walk, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(memory_walk, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(memory_walk_given, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(memory_walk_given, zb_v, std::string("zb-v"))->Apply(sizes);
BENCHMARK_CAPTURE(predict_from_walk, 1f1b, std::string("1f1b"))->Apply(sizes);
BENCHMARK_CAPTURE(predict_from_walk, zb_v, std::string("zb-v"))->Apply(sizes);

BENCHMARK_MAIN();
