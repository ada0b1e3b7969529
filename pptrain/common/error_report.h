// How a pptrain process reports what stopped it: one line on stderr and an exit status, the same
// in the CLI's programs and in the workers a run supervisor forks (job/supervisor.h).
//
//   int status = exit_status_of([&] { run_training_rank(options); });   // 0, 1 or 2
//
// A user's mistake (UserError) is "pptrain: error: <message>" and status 2; our own broken
// invariant (InternalError) "pptrain: internal error: <first line>" and 1; any other failure of
// the run (communication, a file system) "pptrain: error: <first line>" and 1. In a worker of a
// multi-process run (RANK set, WORLD_SIZE above 1) the message starts with "rank R: ".
#pragma once

#include <functional>
#include <string>

namespace pptrain {

// Prints "pptrain: <kind>: [rank R: ]<message>" on stderr and returns `exit_code`.
int report_error(const char* kind, const std::string& message, int exit_code);

// Runs `body`; 0 when it returns, else the exit status of what it threw, reported as above.
int exit_status_of(const std::function<void()>& body);

}  // namespace pptrain
