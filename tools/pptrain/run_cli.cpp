#include <cstdio>
#include <cstdlib>
#include <string>

#include "pptrain/common/error_report.h"
#include "pptrain/common/malloc.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

void exit_unless_ok(const RunResult& result) {
  if (result.ok()) return;
  std::fprintf(stderr, "pptrain: error: %s\n", result.message.c_str());
  std::fflush(stderr);
  std::exit(result.exit_code);
}

int run_cli(CLI::App& app, int argc, char** argv) {
  int parse_status = -1;  // set when the command line itself is wrong, or asks for help
  const int status = exit_status_of([&] {
    // Both programs free and allocate the same large sizes pass after pass (the planner's
    // tables, a step's tensors): kept in the heap, the next ones reuse their pages.
    keep_freed_memory();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help and --version exit 0; every other flag error is one line and exit status 2.
      parse_status = e.get_exit_code() == 0
                         ? app.exit(e)
                         : report_error("error", e.what() + std::string(" (see --help)"), 2);
    }
  });
  return parse_status >= 0 ? parse_status : status;
}

}  // namespace pptrain::cli
