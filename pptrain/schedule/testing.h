// Helpers for the schedule tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

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

}  // namespace pptrain::testing
