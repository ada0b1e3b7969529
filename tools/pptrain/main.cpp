// pptrain: pipeline-parallel training. `pptrain --help` lists the subcommands.
//
// This program is the planner and links no LibTorch, so `--help`, `--version`, `schedule` and
// `partition` start at once. For `train`, `profile` and `run` it replaces itself (execv, same
// arguments) with `pptrain-runtime` from its own folder, so their exit status and signals are that
// program's, unchanged.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "pptrain/common/check.h"
#include "tools/pptrain/commands.h"

namespace {

// PPTRAIN_RUNTIME_BINARY is the runtime program's file name, empty when the build has none
// (-DPPTRAIN_BUILD_RUNTIME=OFF); PPTRAIN_TORCH_VERSION is then "none".
constexpr bool kHasRuntime = sizeof(PPTRAIN_RUNTIME_BINARY) > 1;
constexpr const char* kVersion = "pptrain " PPTRAIN_VERSION "\nLibTorch " PPTRAIN_TORCH_VERSION;

// The subcommands pptrain-runtime runs, with the summaries it gives them in its own --help
// (tests/cli_test.sh checks that the two agree).
struct RuntimeCommand {
  const char* name;
  const char* summary;
};
constexpr RuntimeCommand kRuntimeCommands[] = {
    {"train", "Train a model split into a pipeline across worker processes"},
    {"profile", "Time each layer of a model alone (one thread) and write a profile JSON"},
    {"run", "Start N local ranks of any program with torchrun's environment, supervised"},
};

bool is_runtime_command(const char* arg) {
  for (const RuntimeCommand& command : kRuntimeCommands) {
    if (std::strcmp(arg, command.name) == 0) return true;
  }
  return false;
}

// Runs pptrain-runtime from this executable's folder in place of this process; returns only if
// that fails, with the exit status to use.
int exec_runtime(char** argv) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    std::fprintf(stderr, "pptrain: error: cannot find this program's folder: %s\n",
                 error.message().c_str());
    return 1;
  }
  const std::string runtime = (self.parent_path() / PPTRAIN_RUNTIME_BINARY).string();
  execv(runtime.c_str(), argv);
  std::fprintf(stderr, "pptrain: error: cannot run %s (installed beside pptrain for '%s'): %s\n",
               runtime.c_str(), argv[1], std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // This app takes no option before a subcommand, so a runtime command is argv[1].
  if (argc > 1 && is_runtime_command(argv[1])) {
    if (kHasRuntime) return exec_runtime(argv);
    std::fprintf(stderr,
                 "pptrain: error: '%s' needs pptrain-runtime, which this build left out "
                 "(-DPPTRAIN_BUILD_RUNTIME=OFF)\n",
                 argv[1]);
    return 2;
  }
  CLI::App app{"pptrain: pipeline-parallel training of deep networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);
  pptrain::cli::add_schedule_command(app);
  pptrain::cli::add_partition_command(app);
  pptrain::cli::add_plan_command(app);
  pptrain::cli::add_compare_command(app);
  // Listed in --help only: they never get here (see above).
  for (const RuntimeCommand& command : kRuntimeCommands) {
    if (kHasRuntime) app.add_subcommand(command.name, command.summary);
  }
  return pptrain::cli::run_cli(app, argc, argv);
}
