#include "pptrain/render/chrome_trace.h"

#include <nlohmann/json.hpp>

#include "pptrain/common/check.h"

namespace pptrain {

std::string render_chrome_trace(const Timeline& timeline) {
  const double time_unit_us = timeline.unit == TimeUnit::kSeconds ? 1e6 : 1000;
  // Each event is serialized as soon as it is built, one per line: no tree of hundreds of
  // thousands of events in memory, and a trace that reads and diffs line by line.
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  const auto add = [&](const nlohmann::json& event) {
    if (!first) out += ",\n";
    first = false;
    out += event.dump();
  };
  add({{"name", "process_name"},
       {"ph", "M"},
       {"pid", 0},
       {"args", {{"name", timeline.title.empty() ? "pipeline" : timeline.title}}}});
  for (int r = 0; r < timeline.num_ranks; ++r) {
    add({{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args", {{"name", "rank " + std::to_string(r)}}}});
    // Keeps the rows in rank order in viewers that sort threads by name.
    add({{"name", "thread_sort_index"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args", {{"sort_index", r}}}});
  }
  for (const auto& e : timeline.events) {
    const Action& a = e.action;
    nlohmann::json args = {{"op", op_name(a.op)}};
    if (a.op != Op::OVERLAP_F_B) {
      args["stage"] = a.stage;
      args["microbatch"] = a.microbatch;
    }
    add({{"name", to_string(a)},
         {"cat", is_comm(a.op) ? "comm" : op_name(a.op)},
         {"ph", "X"},
         {"pid", 0},
         {"tid", e.rank},
         {"ts", e.start * time_unit_us},
         {"dur", (e.end - e.start) * time_unit_us},
         {"args", std::move(args)}});
  }
  return out + "\n]}\n";
}

}  // namespace pptrain
