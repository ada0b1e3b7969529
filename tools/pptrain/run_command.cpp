// `pptrain run`: starts N local ranks of any program with torchrun's environment and supervises
// them as `pptrain train` does its own workers.
//
//   pptrain run --nproc 2 ./my_training --steps 10
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT and one
// compute thread (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1); a program using pptrain's library
// joins with pptrain::init_from_env() (api/pipeline.h). When a rank fails (non-zero exit, a
// signal, or stopped for --stopped-timeout seconds), the others are stopped and the run exits
// non-zero with one line naming that rank; with --max-restarts N all are started again, at most
// N times (the program resumes from its own checkpoint, as under torchrun).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pptrain/common/blas_kernels.h"
#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The path execv() runs for `program`: as given when it has a '/', else found on PATH.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    PPTRAIN_CHECK(is_executable_file(program), "cannot run '", program,
                  "': not an executable file");
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  throw UserError("cannot run '" + program + "': no such program on PATH");
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run", "Start N local ranks of any program with torchrun's environment, supervised");
  auto nproc = std::make_shared<int>(1);
  auto stopped_timeout = std::make_shared<int>(60);
  auto max_restarts = std::make_shared<int>(0);
  cmd->add_option("--nproc", *nproc, "Ranks to start (1..1024)")->required();
  cmd->add_option("--stopped-timeout", *stopped_timeout,
                  "Seconds a rank may stay stopped (SIGSTOP) before the run is stopped, naming it");
  cmd->add_option("--max-restarts", *max_restarts,
                  "When a rank fails (not with exit status 2, bad input), stop the others and "
                  "start all again, at most N times; the program continues from its own "
                  "checkpoint (pptrain train: --resume auto). TORCHELASTIC_RESTART_COUNT counts")
      ->capture_default_str();
  // Everything after the program's name is its own: pptrain does not parse it.
  cmd->prefix_command();
  cmd->footer("Usage: pptrain run --nproc N PROGRAM [ARGS...]");
  cmd->callback([cmd, nproc, stopped_timeout, max_restarts] {
    const std::vector<std::string> rest = cmd->remaining();
    PPTRAIN_CHECK(!rest.empty(),
                  "pptrain run needs a program: pptrain run --nproc N PROGRAM [ARGS...]");
    PPTRAIN_CHECK(*nproc >= 1 && *nproc <= 1024, "--nproc must be in 1..1024, got ", *nproc);
    PPTRAIN_CHECK(*stopped_timeout >= 1, "--stopped-timeout must be >= 1 s, got ",
                  *stopped_timeout);
    PPTRAIN_CHECK(*max_restarts >= 0, "--max-restarts must be >= 0, got ", *max_restarts);
    // The ranks inherit the kernels chosen at this program's start (OPENBLAS_CORETYPE and
    // pptrain's note, which `import pptrain` trusts); said once here when pptrain changed them.
    if (blas_kernels_changed()) {
      std::fprintf(stderr, "pptrain: %s\n", blas_kernels_line().c_str());
      std::fflush(stderr);
    }
    LaunchOptions launch;
    launch.workers = *nproc;
    launch.executable = resolve_program(rest.front());
    launch.args.assign(rest.begin() + 1, rest.end());
    launch.stopped_timeout = std::chrono::seconds(*stopped_timeout);
    launch.hold_error_lines = false;  // a program's stderr is its own
    const LaunchResult result =
        launch_with_restarts(launch, *max_restarts, [&](int restart, const LaunchResult& failed) {
          std::fprintf(stderr, "pptrain: restart %d/%d after: %s\n", restart, *max_restarts,
                       failed.message.c_str());
          std::fflush(stderr);
          return true;
        });
    if (result.exit_code != 0) {
      std::fprintf(stderr, "pptrain: error: %s\n", failure_text(result, *max_restarts).c_str());
      std::fflush(stderr);
      std::exit(result.exit_code);
    }
  });
}

}  // namespace pptrain::cli
