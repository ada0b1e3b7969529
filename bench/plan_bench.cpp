// Times each phase of planning a large schedule: generate, lower, validate, simulate, and the
// CSV, SVG and Chrome-trace writers. Prints one line per phase (best of --repeat runs, in ms).
//
//   cmake --build build --target bench_plan && ./build/bench/bench_plan            # zb-v P=64
//   M=512
//   ./build/bench/bench_plan 1f1b 32 256 [chunks] [repeat] [memory_limit]
//   ./build/bench/bench_plan zb-auto 32 256 0 3 32     # the greedy at ZB-1p: "generate" < 1 s
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/generators/registry.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/simulator.h"

namespace {

// Best wall time of `repeat` runs of fn, in milliseconds.
double best_ms(int repeat, const std::function<void()>& fn) {
  double best = 1e300;
  for (int k = 0; k < repeat; ++k) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const auto end = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(end - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pptrain;
  ScheduleOptions options;
  options.name = argc > 1 ? argv[1] : "zb-v";
  options.ranks = argc > 2 ? std::atoi(argv[2]) : 64;
  options.microbatches = argc > 3 ? std::atoi(argv[3]) : 512;
  options.chunks = argc > 4 ? std::atoi(argv[4]) : 0;
  const int repeat = argc > 5 ? std::max(1, std::atoi(argv[5])) : 3;
  options.memory_limit = argc > 6 ? std::atof(argv[6]) : 0;  // zb-auto's limit; 0: none
  try {
    Schedule schedule, lowered;
    std::optional<ValidatedSchedule> validated;
    SimResult result;
    std::string csv, svg, trace;
    struct Phase {
      const char* name;
      std::function<void()> fn;
    };
    const Phase phases[] = {
        {"generate", [&] { schedule = make_schedule(options); }},
        {"lower", [&] { lowered = lower(schedule); }},
        {"validate (compute-only)", [&] { validate(schedule); }},
        {"validate (lowered)", [&] { validated = validate(lowered); }},
        {"simulate",
         [&] { result = simulate(*validated, CostModel::parse("F=1,I=1,W=1,comm=0")); }},
        {"to_csv + parse_csv",
         [&] {
           csv = to_csv(lowered);
           (void)parse_csv(csv);
         }},
        {"render_svg", [&] { svg = render_svg(result.timeline); }},
        {"render_chrome_trace", [&] { trace = render_chrome_trace(result.timeline); }},
    };
    std::printf("%s: P=%d, M=%d, V=%d (0: the schedule's default), repeat=%d, memory limit %g\n",
                options.name.c_str(), options.ranks, options.microbatches, options.chunks, repeat,
                options.memory_limit);
    double planning_ms = 0;  // generate + lower + validate + simulate
    for (const auto& phase : phases) {
      const double ms = best_ms(repeat, phase.fn);
      const std::string name = phase.name;
      if (name == "generate" || name == "lower" || name == "validate (compute-only)" ||
          name == "simulate") {
        planning_ms += ms;
      }
      std::printf("  %-24s %10.2f ms\n", phase.name, ms);
    }
    size_t actions = 0;
    for (const auto& list : lowered.actions) actions += list.size();
    std::printf("  %-24s %10.2f ms  (generate + lower + validate + simulate)\n", "planning total",
                planning_ms);
    std::printf(
        "  %zu lowered actions, %zu timeline events, bubble ratio %.4f, csv %zu KiB, "
        "svg %zu KiB, trace %zu KiB\n",
        actions, result.timeline.events.size(), result.bubble_ratio, csv.size() / 1024,
        svg.size() / 1024, trace.size() / 1024);
  } catch (const UserError& e) {
    std::fprintf(stderr, "bench_plan: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
