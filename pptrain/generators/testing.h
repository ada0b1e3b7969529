// Helpers for the schedule tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/schedule/grid.h"
#include "pptrain/schedule/validate.h"

namespace pptrain::testing {

// Runs validate and returns the error it throws; fails the test if it throws none.
inline ScheduleError validation_error(const Schedule& schedule) {
  try {
    validate(schedule);
  } catch (const ScheduleError& e) {
    return e;
  }
  ADD_FAILURE() << "validate accepted:\n" << render_grid(schedule);
  return ScheduleError(-2, -2, "", "");
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Calls check(made, what) for every schedule of the registry at each P of `ranks` and M of
// `microbatches` that its generator makes, as made and, where it has 3 stages or more, with a
// skip message from its first stage to its last as well (its own peer ranks); `what` names it.
template <typename Check>
void for_each_schedule(const std::vector<int>& ranks, const std::vector<int>& microbatches,
                       Check check) {
  for (const ScheduleEntry& entry : schedule_registry()) {
    for (int p : ranks) {
      for (int m : microbatches) {
        Schedule made;
        try {
          made = make_schedule(ScheduleOptions{entry.name, p, m});
        } catch (const UserError&) {
          continue;  // not for these P, M
        }
        const std::string what = entry.name + " P=" + std::to_string(p) + " M=" + std::to_string(m);
        check(made, what);
        if (made.num_stages < 3) continue;
        made.skips = {{0, made.num_stages - 1}};
        check(made, what + " with a skip");
      }
    }
  }
}

}  // namespace pptrain::testing
