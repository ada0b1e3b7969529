// pptrain-runtime: the subcommands of pptrain that need LibTorch or its launcher: `train`,
// `profile` and `run`.
// `pptrain` replaces itself with this program for them (same arguments, argv[0] included, so
// help and errors still say `pptrain`); the workers of `pptrain train` are this program forked
// (job/supervisor.h), those of `pptrain run` the user's program.
#include <cstdio>

#include "pptrain/common/blas_kernels.h"
#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

int main(int argc, char** argv) {
  // OpenBLAS chose its kernels as this program loaded; when pptrain has better ones for this CPU,
  // this runs the program again with them (common/blas_kernels.h). Started by `pptrain`, which
  // chose already, it only reads the choice. The forked workers inherit it.
  try {
    pptrain::settle_blas_kernels(argv);
  } catch (const pptrain::UserError& e) {
    std::fprintf(stderr, "pptrain: error: %s\n", e.what());
    return 2;
  }
  using namespace pptrain::cli;
  CLI::App app{"pptrain: pipeline-parallel training of deep networks (the LibTorch commands)"};
  app.require_subcommand(1);
  add_train_command(app);
  add_profile_command(app);
  add_run_command(app);
  return run_cli(app, argc, argv);
}
