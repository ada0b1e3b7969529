// `pptrain run`: starts N local ranks of any program with torchrun's environment and supervises
// them as `pptrain train` does its own workers (job/supervisor.h, run_program()).
//
//   pptrain run --nproc 2 ./my_training --steps 10
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT and one
// compute thread (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1); a program using pptrain's library
// joins with pptrain::init_from_env() (api/pipeline.h). When a rank fails (non-zero exit, a
// signal, or stopped for --stopped-timeout seconds), the others are stopped and the run exits
// non-zero with one line naming that rank; with --max-restarts N all are started again, at most
// N times (the program resumes from its own checkpoint, as under torchrun).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "pptrain/common/blas_kernels.h"
#include "pptrain/job/supervisor.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

void add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run", "Start N local ranks of any program with torchrun's environment, supervised");
  auto run = std::make_shared<ProgramRun>();
  cmd->add_option("--nproc", run->ranks, "Ranks to start (1..1024)")->required();
  cmd->add_option("--stopped-timeout", run->stopped_timeout_s,
                  "Seconds a rank may stay stopped (SIGSTOP) before the run is stopped, naming it");
  cmd->add_option("--max-restarts", run->max_restarts,
                  "When a rank fails (not with exit status 2, bad input), stop the others and "
                  "start all again, at most N times; the program continues from its own "
                  "checkpoint (pptrain train: --resume auto). TORCHELASTIC_RESTART_COUNT counts")
      ->capture_default_str();
  // Everything after the program's name is its own: pptrain does not parse it.
  cmd->prefix_command();
  cmd->footer("Usage: pptrain run --nproc N PROGRAM [ARGS...]");
  cmd->callback([cmd, run] {
    const std::vector<std::string> rest = cmd->remaining();
    ProgramRun program = *run;
    if (!rest.empty()) {
      program.program = rest.front();
      program.args.assign(rest.begin() + 1, rest.end());
    }
    // The ranks inherit the kernels chosen at this program's start (OPENBLAS_CORETYPE and
    // pptrain's note, which `import pptrain` trusts); said once here when pptrain changed them.
    if (blas_kernels_changed()) {
      std::fprintf(stderr, "pptrain: %s\n", blas_kernels_line().c_str());
      std::fflush(stderr);
    }
    exit_unless_ok(run_program(program));
  });
}

}  // namespace pptrain::cli
