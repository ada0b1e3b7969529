// pptrain-runtime: the subcommands of pptrain that need LibTorch or its launcher: `train`,
// `profile` and `run`.
// `pptrain` replaces itself with this program for them (same arguments, argv[0] included, so
// help and errors still say `pptrain`); the launcher's workers are this program again.
#include "tools/pptrain/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"pptrain: pipeline-parallel training of deep networks (the LibTorch commands)"};
  app.require_subcommand(1);
  pptrain::cli::add_train_command(app);
  pptrain::cli::add_profile_command(app);
  pptrain::cli::add_run_command(app);
  return pptrain::cli::run_cli(app, argc, argv);
}
