#include "pptrain/render/chrome_trace.h"

#include <nlohmann/json.hpp>

#include "pptrain/common/check.h"

namespace pptrain {

std::string render_chrome_trace(const Timeline& timeline, double time_unit_us) {
  PPTRAIN_CHECK(time_unit_us > 0, "chrome trace time unit must be > 0 microseconds, got ",
                time_unit_us);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"args", {{"name", timeline.title.empty() ? "pipeline" : timeline.title}}}});
  for (int r = 0; r < timeline.num_ranks; ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    // Keeps the rows in rank order in viewers that sort threads by name.
    events.push_back({{"name", "thread_sort_index"},
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
    events.push_back({{"name", to_string(a)},
                      {"cat", is_comm(a.op) ? "comm" : op_name(a.op)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", e.rank},
                      {"ts", e.start * time_unit_us},
                      {"dur", (e.end - e.start) * time_unit_us},
                      {"args", std::move(args)}});
  }
  nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump() + "\n";
}

}  // namespace pptrain
