// Timelines as Chrome trace JSON, for Perfetto (ui.perfetto.dev) and chrome://tracing.
//
//   {"traceEvents": [{"name": "1F3", "cat": "F", "ph": "X", "pid": 0, "tid": 1,
//                     "ts": 2000, "dur": 1000, "args": {...}}, ...,
//                    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1,
//                     "args": {"name": "rank 1"}}], "displayTimeUnit": "ms"}
//
// One complete event ("ph": "X") per action, named by its text form, on thread `rank`; one
// thread_name metadata event per rank. Times are microseconds: time_unit_us says how many a
// timeline unit is (1e6 for a measured run in seconds; 1000 for a simulated run in cost units,
// so that one unit shows as one millisecond).
//
//   std::ofstream("1f1b.json") << render_chrome_trace(result.timeline, 1000);
#pragma once

#include <string>

#include "pptrain/render/timeline.h"

namespace pptrain {

std::string render_chrome_trace(const Timeline& timeline, double time_unit_us = 1000);

}  // namespace pptrain
