// pptrain: pipeline-parallel training. `pptrain --help` lists the subcommands.
#include <cstdio>
#include <exception>

#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pptrain: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
