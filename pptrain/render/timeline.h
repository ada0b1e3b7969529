// What happened (or is predicted to happen) when a schedule ran: one event per action, per rank.
// The simulator and the runtime both produce a Timeline, so a predicted and a measured run are
// drawn, traced and compared the same way.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/action.h"

namespace pptrain {

struct TimelineEvent {
  int rank = 0;
  Action action;
  double start = 0;  // seconds for a measured run; cost-model units for a simulated one
  double end = 0;
};

struct Timeline {
  std::string title;  // e.g. "1f1b, P=4, M=8"
  int num_ranks = 0;
  std::vector<TimelineEvent> events;  // any order; renderers sort as they need
};

}  // namespace pptrain
