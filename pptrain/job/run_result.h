// How a supervised run ended (job/supervisor.h): plain data, no LibTorch, so that the planner's
// program can hold it too.
#pragma once

#include <string>

namespace pptrain {

struct RunResult {
  int exit_code = 0;  // 0; 1 for a failure of the run; 2 when a worker found bad input
  // Empty on success; else one line naming the failed rank and its cause, with "(after N
  // restarts)" when the restarts were used up.
  std::string message;
  bool ok() const { return exit_code == 0; }
};

}  // namespace pptrain
