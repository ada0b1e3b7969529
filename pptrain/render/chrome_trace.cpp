#include "pptrain/render/chrome_trace.h"

#include <nlohmann/json.hpp>
#include <vector>

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
  const int ranks = timeline.num_ranks;
  // A rank's all-reduces overlap its compute, so they get a track of their own, right below it.
  std::vector<char> reduces(ranks, 0);
  for (const auto& e : timeline.events) {
    if (is_collective(e.action.op) && e.rank >= 0 && e.rank < ranks) reduces[e.rank] = 1;
  }
  const auto track = [&](int tid, const std::string& name, int sort_index) {
    add({{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", tid},
         {"args", {{"name", name}}}});
    // Keeps the rows in rank order in viewers that sort threads by name.
    add({{"name", "thread_sort_index"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", tid},
         {"args", {{"sort_index", sort_index}}}});
  };
  for (int r = 0; r < ranks; ++r) {
    track(r, "rank " + std::to_string(r), 2 * r);
    if (reduces[r]) track(ranks + r, "rank " + std::to_string(r) + " all-reduce", 2 * r + 1);
  }
  for (const auto& e : timeline.events) {
    const Action& a = e.action;
    nlohmann::json args = {{"op", op_name(a.op)}};
    if (a.op != Op::OVERLAP_F_B) args["stage"] = a.stage;
    if (a.op != Op::OVERLAP_F_B && !is_collective(a.op)) args["microbatch"] = a.microbatch;
    const bool reduce = is_collective(a.op);
    add({{"name", to_string(a)},
         {"cat", is_comm(a.op) ? "comm"
                 : reduce      ? "all-reduce"
                               : op_name(a.op)},
         {"ph", "X"},
         {"pid", 0},
         {"tid", reduce ? ranks + e.rank : e.rank},
         {"ts", e.start * time_unit_us},
         {"dur", (e.end - e.start) * time_unit_us},
         {"args", std::move(args)}});
  }
  return out + "\n]}\n";
}

}  // namespace pptrain
