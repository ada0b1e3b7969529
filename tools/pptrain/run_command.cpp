// `pptrain run`: starts N local ranks of any program with torchrun's environment and supervises
// them as `pptrain train` does its own workers (job/supervisor.h, run_program()); with
// torchrun's --nnodes flags, as a node agent, this node's ranks of a run over several nodes
// (runtime/rendezvous.h: static, or the c10d rendezvous).
//
//   pptrain run --nproc 2 ./my_training --steps 10
//   pptrain run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400
//               --rdzv-id=job1 ./my_training           (on each node)
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

#include "pptrain/job/supervisor.h"
#include "pptrain/job/train_args.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

void add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run", "Start N local ranks of any program with torchrun's environment, supervised");
  auto run = std::make_shared<ProgramRun>();
  auto flags = std::make_shared<TrainArgs>();  // its torchrun flags of the nodes only
  CLI::Option* nproc = cmd->add_option("--nproc", run->ranks,
                                       "Ranks to start on this one node (1..1024), the short "
                                       "form of --nproc-per-node N");
  for (const TrainFlag& flag : train_flags()) {
    if (!flag.has(TrainFlag::kNode)) continue;
    CLI::Option* option = add_train_flag(cmd, flag, *flags);
    if (option->get_name() == "--nproc-per-node") option->excludes(nproc);
  }
  cmd->add_option("--stopped-timeout", run->stopped_timeout_s,
                  "Seconds a rank may stay stopped (SIGSTOP) before the run is stopped, naming it");
  cmd->add_option("--max-restarts", run->max_restarts,
                  "When a rank fails (not with exit status 2, bad input), stop the others and "
                  "start all again, at most N times; the program continues from its own "
                  "checkpoint (pptrain train: --resume auto). TORCHELASTIC_RESTART_COUNT counts")
      ->capture_default_str();
  cmd->add_option("--max_restarts", run->max_restarts)->group("");  // torchrun's other spelling
  // Everything after the program's name is its own: pptrain does not parse it.
  cmd->prefix_command();
  cmd->footer(
      "Usage: pptrain run --nproc N PROGRAM [ARGS...]\n"
      "       pptrain run --nnodes 2 --nproc-per-node N --node-rank R --master-addr HOST "
      "--master-port PORT PROGRAM [ARGS...]\n"
      "       pptrain run --nnodes 2 --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint "
      "HOST:PORT --rdzv-id ID PROGRAM [ARGS...]");
  cmd->callback([cmd, run, flags] {
    const std::vector<std::string> rest = cmd->remaining();
    ProgramRun program = *run;
    program.nodes = flags->nodes;
    if (flags->nodes.nproc_per_node > 0) program.ranks = flags->nodes.nproc_per_node;
    if (!rest.empty()) {
      program.program = rest.front();
      program.args.assign(rest.begin() + 1, rest.end());
    }
    exit_unless_ok(run_program(program));
  });
}

}  // namespace pptrain::cli
