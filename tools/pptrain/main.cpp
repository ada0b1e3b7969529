// pptrain: pipeline-parallel training. `pptrain --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <string>

#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

namespace {

// Errors from libraries can carry a backtrace after their message: one line is what a user reads.
std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pptrain: pipeline-parallel training of deep networks"};
  app.require_subcommand(1);
  pptrain::cli::add_schedule_command(app);
  pptrain::cli::add_partition_command(app);
#ifdef PPTRAIN_WITH_RUNTIME
  pptrain::cli::add_train_command(app);
  pptrain::cli::add_profile_command(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every other flag error is one line and exit status 2.
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
