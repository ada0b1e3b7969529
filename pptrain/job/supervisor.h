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

#include "pptrain/train/plan.h"

namespace pptrain {

// How a run ended.
struct RunResult {
  int exit_code = 0;  // 0; 1 for a failure of the run; 2 when a worker found bad input
  // Empty on success; else one line naming the failed rank and its cause, with "(after N
  // restarts)" when the restarts were used up.
  std::string message;
  bool ok() const { return exit_code == 0; }
};

// Runs `options`' training to its end (see above). Throws UserError on bad options; a failure
// of a rank in this process (a one-process run, or a rank started by torchrun) throws too.
RunResult run_training(const TrainOptions& options);

}  // namespace pptrain
