// The run supervisor as a library call (job/supervisor.h): a C++ program that calls
// run_training() gets what `pptrain train` does, restarts included. This test program is that
// program: the workers are forks of it.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "pptrain/job/supervisor.h"
#include "tests/e2e.h"

namespace pptrain::e2e {
namespace {

TrainOptions small_run(int steps) {
  TrainOptions options;
  options.model = small_model("gpt");
  options.schedule = "1f1b";
  options.pp = 2;
  options.data.batch_size = 8;
  options.data.microbatches = 4;
  options.quiet = true;
  options.steps = steps;
  return options;
}

// run_training(options) with this process's stderr in `err` and PPTRAIN_TEST_CRASH_* set to
// make worker rank `crash_rank` abort at the start of step `crash_step` (once, when `once` names
// a file: the marker the first crash leaves).
pptrain::RunResult run_crashing(const TrainOptions& options, int crash_rank, int crash_step,
                                const std::string& once, std::string* err) {
  setenv("PPTRAIN_TEST_CRASH_RANK", std::to_string(crash_rank).c_str(), 1);
  setenv("PPTRAIN_TEST_CRASH_STEP", std::to_string(crash_step).c_str(), 1);
  if (!once.empty()) setenv("PPTRAIN_TEST_CRASH_ONCE", once.c_str(), 1);
  const std::string captured = once.empty() ? "/dev/null" : once + ".stderr";
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  const int file = open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(file, STDERR_FILENO);
  close(file);
  const pptrain::RunResult result = run_training(options);
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  unsetenv("PPTRAIN_TEST_CRASH_RANK");
  unsetenv("PPTRAIN_TEST_CRASH_STEP");
  unsetenv("PPTRAIN_TEST_CRASH_ONCE");
  *err = read_text(captured);
  return result;
}

// A worker killed at step 4 of 6 once: the supervisor starts the ranks again from the newest
// whole checkpoint (step 2) and the run ends where an uninterrupted one does.
TEST(RunTraining, RestartsAFailedRunFromTheNewestCheckpoint) {
  TempDir dir;
  TrainOptions options = small_run(6);
  options.save_dir = (dir / "whole").string();
  ASSERT_TRUE(run_training(options).ok());

  options.save_dir = (dir / "ckpt").string();
  options.save_every = 2;
  options.sync_save = true;  // a background save of step 2 could still be on its way at step 3
  options.max_restarts = 2;
  std::string err;
  const pptrain::RunResult result = run_crashing(options, 1, 3, (dir / "crashed").string(), &err);
  EXPECT_TRUE(result.ok()) << result.message << "\n" << err;
  EXPECT_TRUE(fs::exists(dir / "crashed"));  // it did fail once
  EXPECT_NE(err.find("pptrain: restart 1/2 after: worker rank 1 was killed by signal 6"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("resuming from step 2 of " + options.save_dir), std::string::npos) << err;
  expect_same_parameters(options.model, dir / "ckpt", dir / "whole", 1e-6);
}

// A worker that fails every time uses the restarts up: a failed result naming it and the count.
TEST(RunTraining, ExhaustedRestartsEndInAFailedResult) {
  TempDir dir;
  TrainOptions options = small_run(4);
  options.save_dir = (dir / "ckpt").string();
  options.save_every = 2;
  options.max_restarts = 1;
  std::string err;
  const pptrain::RunResult result = run_crashing(options, 0, 3, "", &err);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.message.find("worker rank 0 was killed by signal 6"), std::string::npos)
      << result.message;
  EXPECT_NE(result.message.find("(after 1 restart)"), std::string::npos) << result.message;
}

// Bad options are a UserError before any worker starts.
TEST(RunTraining, BadOptionsThrowBeforeAnyWorkerStarts) {
  TrainOptions options = small_run(2);
  options.max_restarts = 1;  // without --save: nothing to restart from
  EXPECT_THROW(run_training(options), UserError);
}

}  // namespace
}  // namespace pptrain::e2e
