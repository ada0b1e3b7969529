// A whole training run of pptrain's own models (gpt, mlp, unet), as `pptrain train` runs it,
// for any program: the C++ API's and Python's `pptrain.train()` are this same function.
//
//   pptrain::TrainOptions options;          // or resolve_train_args() (job/train_args.h)
//   options.model.kind = "gpt";  options.pp = 2;  options.data.microbatches = 4;
//   options.save_dir = "ckpt";  options.save_every = 10;  options.max_restarts = 2;
//   pptrain::RunResult result = pptrain::run_training(options);
//   if (!result.ok()) std::fprintf(stderr, "%s\n", result.message.c_str());
//
// run_training() checks everything that does not need the workers first (a UserError, before
// any worker starts), resolves `--resume auto` to the newest whole checkpoint of save_dir, and
// then either trains in this process (a one-process run, or a rank of a run started by torchrun
// or `pptrain run`: RANK set) or supervises the D x P workers: it starts them (this process
// forked, so LibTorch is loaded once), watches them (a worker that dies, fails or stays stopped
// stops the others, runtime/launcher.h) and, at most options.max_restarts times, starts a failed
// run again from the newest whole checkpoint of save_dir. Its progress ("--resume auto: ...",
// "restart 1/2 after: ...") goes to stderr, one line each.
//
// A process that supervises workers must not have started threads of its own nor run an OpenMP
// team of more than one thread before (LaunchOptions::run_in_child): run_training() sets one
// compute thread before it forks.
#pragma once

#include <string>
#include <vector>

#include "pptrain/job/run_result.h"
#include "pptrain/runtime/cluster_env.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// Runs `options`' training to its end (see above). Throws UserError on bad options; a failure
// of a rank in this process (a one-process run, or a rank started by torchrun, srun or mpirun)
// throws too. `nodes`: torchrun's --nnodes flags, for a run over several nodes whose workers
// this process starts on its own node (runtime/rendezvous.h); nproc_per_node 0 is --pp x --dp
// over the nodes. Their --master-addr and --master-port also name rank 0's host under mpirun.
RunResult run_training(const TrainOptions& options, const NodeGroupOptions& nodes = {});

// `pptrain run`: N ranks of any program on this node, with torchrun's environment
// (runtime/launcher.h), supervised as run_training() supervises its workers; with `nodes`, this
// node's ranks of a run over several (runtime/rendezvous.h).
struct ProgramRun {
  int ranks = 1;  // 1..1024 on this node (--nproc, --nproc-per-node)
  NodeGroupOptions nodes;
  std::string program;            // a path, or a name found on PATH
  std::vector<std::string> args;  // the program's own arguments
  int stopped_timeout_s = 60;     // a rank stopped (SIGSTOP) this long stops the run, named
  // Restarts of the whole group after a failure (not after exit status 2, bad input); the
  // program continues from its own checkpoint, TORCHELASTIC_RESTART_COUNT counting them.
  int max_restarts = 0;
};

// Starts the ranks and supervises them to their end. UserError on bad options (a program that
// is not an executable file, a count out of range).
RunResult run_program(const ProgramRun& run);

}  // namespace pptrain
