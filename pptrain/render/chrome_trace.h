// Timelines as Chrome trace JSON, for Perfetto (ui.perfetto.dev) and chrome://tracing.
//
//   {"traceEvents": [{"name": "1F3", "cat": "F", "ph": "X", "pid": 0, "tid": 1,
//                     "ts": 2000, "dur": 1000, "args": {...}}, ...,
//                    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1,
//                     "args": {"name": "rank 1"}}], "displayTimeUnit": "ms"}
//
// One complete event ("ph": "X") per action, named by its text form, on thread `rank`; one
// thread_name metadata event per rank. A data-parallel all-reduce (REDUCE_GRAD), which overlaps
// the rank's compute, goes on a track of its own, thread `num_ranks + rank` named
// "rank R all-reduce" and sorted right below its rank (category "all-reduce"). Times are
// microseconds, from the timeline's unit: a second is 1e6; a simulated run's cost unit shows as one
// millisecond (1000).
//
//   std::ofstream("1f1b.json") << render_chrome_trace(result.timeline);
#pragma once

#include <string>

#include "pptrain/schedule/timeline.h"

namespace pptrain {

std::string render_chrome_trace(const Timeline& timeline);

}  // namespace pptrain
