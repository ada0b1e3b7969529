// pptrain-runtime: the subcommands of pptrain that need LibTorch or its launcher: `train`,
// `profile` and `run`.
// `pptrain` replaces itself with this program for them (same arguments, argv[0] included, so
// help and errors still say `pptrain`); the workers of `pptrain train` are this program forked,
// those of `pptrain run` the user's program.
#include <cstdio>
#include <string>
#include <vector>

#include "pptrain/common/blas_kernels.h"
#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

namespace {

int run_runtime_commands(int argc, char** argv) {
  CLI::App app{"pptrain: pipeline-parallel training of deep networks (the LibTorch commands)"};
  app.require_subcommand(1);
  add_train_command(app);
  add_profile_command(app);
  add_run_command(app);
  return run_cli(app, argc, argv);
}

}  // namespace

int run_runtime_cli(const std::vector<std::string>& args) {
  std::string program = "pptrain";
  std::vector<char*> argv{program.data()};
  std::vector<std::string> copies = args;  // CLI11 takes char*, and does not write through it
  for (std::string& arg : copies) argv.push_back(arg.data());
  return run_runtime_commands(static_cast<int>(argv.size()), argv.data());
}

}  // namespace pptrain::cli

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
  return pptrain::cli::run_runtime_commands(argc, argv);
}
