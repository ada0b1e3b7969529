// Runs a program as a child process and waits for it: what `pptrain compare` trains with (one
// `pptrain train` after the other).
//
//   ChildResult r = run_child({"/usr/bin/pptrain", "train", ...}, "run.out", "run.err");
//   if (r.exit_code != 0) ...   // its stderr is in run.err
#pragma once

#include <string>
#include <vector>

namespace pptrain {

struct ChildResult {
  int exit_code = 0;  // its exit status; 128 + the signal that ended it; 127 if it never ran
  double wall_s = 0;  // from its start to its end, seconds
};

// Runs `argv` (argv[0] a path, not looked up on the PATH) with stdin from /dev/null and stdout
// and stderr into the two files (replaced), and waits for it. A program that cannot be started
// gives 127 and the reason in the stderr file.
ChildResult run_child(const std::vector<std::string>& argv, const std::string& stdout_path,
                      const std::string& stderr_path);

}  // namespace pptrain
