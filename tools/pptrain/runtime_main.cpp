// pptrain-runtime: the subcommands of pptrain that need LibTorch or its launcher: `train`,
// `profile` and `run`.
// `pptrain` replaces itself with this program for them (same arguments, argv[0] included, so
// help and errors still say `pptrain`); the workers of `pptrain train` are this program forked
// (job/supervisor.h), those of `pptrain run` the user's program.

#include "tools/pptrain/commands.h"

int main(int argc, char** argv) {
  using namespace pptrain::cli;
  CLI::App app{"pptrain: pipeline-parallel training of deep networks (the LibTorch commands)"};
  app.require_subcommand(1);
  add_train_command(app);
  add_profile_command(app);
  add_run_command(app);
  return run_cli(app, argc, argv);
}
