#include <cstdio>
#include <exception>
#include <string>

#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

// Errors from libraries can carry a backtrace after their message: one line is what a user reads.
std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

int run_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other flag error is one line and exit status 2.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "pptrain: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const pptrain::UserError& e) {
    std::fprintf(stderr, "pptrain: error: %s\n", e.what());
    return 2;
  } catch (const pptrain::InternalError& e) {
    std::fprintf(stderr, "pptrain: internal error: %s\n", first_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {  // a failure of the run: communication, a file system, ...
    std::fprintf(stderr, "pptrain: error: %s\n", first_line(e.what()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace pptrain::cli
