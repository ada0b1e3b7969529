// What happened (or is predicted to happen) when a schedule ran: one event per action, per rank.
// The simulator and the runtime both produce a Timeline, so a predicted and a measured run are
// drawn, traced and compared the same way.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/action.h"

namespace pptrain {

// What a timeline's times count.
enum class TimeUnit {
  kCostUnits,  // a simulation: the cost model's abstract units (F=1 ...)
  kSeconds,    // a measured run
};
// "cost units" or "s", as axes and tables print it.
inline const char* unit_name(TimeUnit unit) {
  return unit == TimeUnit::kSeconds ? "s" : "cost units";
}

struct TimelineEvent {
  int rank = 0;
  Action action;
  double start = 0;  // in the timeline's unit
  double end = 0;
};

struct Timeline {
  std::string title;  // e.g. "1f1b, P=4, M=8"
  int num_ranks = 0;
  std::vector<TimelineEvent> events;  // any order; renderers sort as they need
  TimeUnit unit = TimeUnit::kCostUnits;
};

}  // namespace pptrain
