// End-to-end tests of checkpoints (train/checkpoint.h): a save is whole or refused, a killed
// save keeps the previous checkpoint, and a resumed run equals an uninterrupted one, also at
// another --pp. Each case runs the real binary (PPTRAIN_BINARY).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pptrain/runtime/tensor_file.h"
#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;  // TempDir, run_train, read_losses, small_model, expect_same_parameters, ...

// A checkpoint is whole or refused: a second save replaces the folder (a stray file of an
// earlier model goes) and leaves no DIR.partial; --load refuses a folder without a manifest, a
// damaged layer file and flags of another shape, and --save refuses a file, each with exit
// status 2 before any training.
TEST(Checkpoint, WholeOrRefused) {
  TempDir dir;
  const ModelOptions model = small_model("gpt");
  const std::string common = " --batch-size 8 --microbatches 4 --quiet --steps 1";
  const fs::path ckpt = dir / "ckpt";
  auto run = run_train(model_args(model) + " --pp 2" + common + " --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(fs::is_regular_file(ckpt / "manifest.json"));
  std::ofstream(ckpt / "layer_99.pt") << "from a larger model";
  run = run_train(model_args(model) + " --pp 1" + common + " --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_FALSE(fs::exists(ckpt / "layer_99.pt"));
  EXPECT_FALSE(fs::exists(dir / "ckpt.partial"));
  run = run_train(model_args(model) + " --pp 2" + common + " --load " + ckpt.string(), dir);
  EXPECT_EQ(run.exit_code, 0) << run.err;

  const auto refused = [&](const std::string& args, const std::string& message) {
    const auto out = run_train(args + common, dir);
    EXPECT_EQ(out.exit_code, 2) << args;
    EXPECT_NE(out.err.find(message), std::string::npos) << out.err;
  };
  ModelOptions wider = model;
  wider.d_model = 2 * model.d_model;
  refused(model_args(wider) + " --pp 1 --load " + ckpt.string(),
          "checkpoint has d_model " + std::to_string(model.d_model) + ", flags say " +
              std::to_string(wider.d_model));
  const fs::path damaged = dir / "damaged";
  fs::copy(ckpt, damaged);
  std::ofstream(damaged / "layer_0.pt", std::ios::app) << "x";
  refused(model_args(model) + " --pp 1 --load " + damaged.string(), "layer_0.pt' is damaged");
  fs::remove(damaged / "manifest.json");
  refused(model_args(model) + " --pp 1 --load " + damaged.string(),
          "is not a whole checkpoint: it has no manifest.json");
  refused(model_args(model) + " --pp 1 --save " + (ckpt / "manifest.json").string(),
          "is a file, not a folder");
}

// A save killed before its swap, with the layers written or also the manifest, leaves the
// previous checkpoint as it was, and it loads; the next save clears what the killed one left.
TEST(Checkpoint, AKilledSaveKeepsThePreviousOne) {
  TempDir dir;
  const std::string common =
      model_args(small_model("gpt")) + " --pp 2 --batch-size 8 --microbatches 4 --quiet --steps 1";
  const fs::path ckpt = dir / "ckpt";
  auto run = run_train(common + " --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string manifest = read_text(ckpt / "manifest.json");
  for (const std::string moment : {"layers", "manifest"}) {
    run = run_train(common + " --seed 7 --save " + ckpt.string(), dir,
                    "PPTRAIN_TEST_CRASH_SAVE=" + moment + " ");
    EXPECT_NE(run.exit_code, 0) << moment;
    EXPECT_EQ(read_text(ckpt / "manifest.json"), manifest) << moment;
    run = run_train(common + " --load " + ckpt.string(), dir);
    EXPECT_EQ(run.exit_code, 0) << moment << ": " << run.err;
  }
  run = run_train(common + " --seed 7 --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(read_text(ckpt / "manifest.json"), manifest);
  EXPECT_FALSE(fs::exists(dir / "ckpt.partial"));
}

// Every file of `dir` and its bytes, by name.
std::map<std::string, std::string> folder_contents(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    files[entry.path().filename().string()] = read_text(entry.path());
  }
  return files;
}

// True when two checkpoints' folders hold the same files and the same parameters, byte for byte.
// (An optimizer's file holds its parameters' addresses in memory, so two runs' differ; the
// manifest's checksums, which --load checks, cover them.)
bool same_parameters(const std::map<std::string, std::string>& a,
                     const std::map<std::string, std::string>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, bytes] : a) {
    const auto other = b.find(name);
    if (other == b.end()) return false;
    if (name.rfind("layer_", 0) == 0 && other->second != bytes) return false;
  }
  return true;
}

// kill -9 of the launcher (from outside, as a user would) at moments spread over a save that
// replaces a good checkpoint (PPTRAIN_TEST_SAVE_PAUSE_MS stretches each moment of the save to
// 400 ms): the workers die with it, and DIR is then always the previous checkpoint or the new
// one, file for file, and loads; what the save left beside it (DIR.partial) loads whole or is
// refused with one line and exit status 2, never silently taken in part.
TEST(Checkpoint, KillingTheLauncherDuringASaveKeepsAWholeOne) {
  TempDir dir;
  const std::string common =
      model_args(small_model("gpt")) + " --pp 2 --batch-size 8 --microbatches 4 --quiet --steps 1";
  const fs::path ckpt = dir / "ckpt", partial = dir / "ckpt.partial";
  // The previous checkpoint (seed 0) and what the killed save writes when left alone (seed 7).
  auto run = run_train(common + " --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  run = run_train(common + " --seed 7 --save " + (dir / "new").string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  fs::copy(ckpt, dir / "old");
  const auto previous = folder_contents(ckpt), next = folder_contents(dir / "new");
  ASSERT_NE(previous, next);
  const std::string command = "PPTRAIN_TEST_SAVE_PAUSE_MS=400 exec " + std::string(PPTRAIN_BINARY) +
                              " train " + common + " --seed 7 --save " + ckpt.string() + " >" +
                              (dir / "out").string() + " 2>" + (dir / "err").string();
  const auto load = [&](const fs::path& folder) {
    return run_train(model_args(small_model("gpt")) +
                         " --pp 1 --batch-size 8 --microbatches 4 --quiet --steps 1 --load " +
                         folder.string(),
                     dir);
  };
  int kept_previous = 0;
  for (const int delay_ms : {0, 200, 600, 1000, 1400, 1800, 2300}) {
    SCOPED_TRACE("killed " + std::to_string(delay_ms) + " ms into the save");
    const pid_t launcher = fork();
    ASSERT_GE(launcher, 0);
    if (launcher == 0) {
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // The save starts when the leader creates DIR.partial (or, were it to write in place, when
    // DIR changes).
    const auto start = std::chrono::steady_clock::now();
    while (!fs::exists(partial) && folder_contents(ckpt) == previous &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(launcher, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
    // No worker outlives its launcher (PR_SET_PDEATHSIG): none is left within 10 s.
    const auto killed = std::chrono::steady_clock::now();
    while (!processes_mentioning(ckpt.string()).empty() &&
           std::chrono::steady_clock::now() - killed < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(processes_mentioning(ckpt.string()).empty()) << read_text(dir / "err");
    const auto now = folder_contents(ckpt);
    EXPECT_TRUE(now == previous || same_parameters(now, next))
        << "DIR is a mix of the two checkpoints";
    kept_previous += now == previous;
    run = load(ckpt);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    if (fs::exists(partial)) {
      run = load(partial);
      if (run.exit_code != 0) expect_one_line_error(run, "--load '" + partial.string() + "'");
    }
    // The next kill replaces the previous checkpoint again, and its save starts when it makes
    // DIR.partial anew.
    fs::remove_all(partial);
    if (now != previous) {
      fs::remove_all(ckpt);
      fs::copy(dir / "old", ckpt);
    }
  }
  // At least the first kills hit the save before its swap.
  EXPECT_GE(kept_previous, 1);
}

struct ResumeCase {
  std::string schedule;
  int save_pp;    // the run that saves after 3 steps
  int resume_pp;  // the run that resumes it to step 6
  std::string optimizer;
  bool tied = false;  // --tie-embeddings: the table is stored once, in layer 0's file
  // Each run's cut of the model's 10 layers (--stage-layers; "": the uniform one), e.g. another
  // one at the resume, as --partition workers gives when the ranks measure other speeds.
  std::string save_cut = "";
  std::string resume_cut = "";
};

void PrintTo(const ResumeCase& c, std::ostream* out) {
  *out << c.schedule << " pp " << c.save_pp << " -> " << c.resume_pp << " " << c.optimizer
       << (c.tied ? " tied" : "") << (c.save_cut.empty() ? "" : " cut " + c.save_cut)
       << (c.resume_cut.empty() ? "" : " -> " + c.resume_cut);
}

class Resume : public ::testing::TestWithParam<ResumeCase> {};

// 3 steps, save, resume to step 6 equals 6 uninterrupted steps, to 1e-6 in every loss and the
// final parameters, at the same --pp or another. The learning rate warms up over all 6 steps and
// SGD has momentum (AdamW its moments and step count), so a resume that lost the step or the
// optimizer state differs.
TEST_P(Resume, ThreeStepsSavedAndResumedEqualSixSteps) {
  const ResumeCase& c = GetParam();
  TempDir dir;
  ModelOptions model = small_model("gpt");
  model.tie_embeddings = c.tied;
  const std::string common = model_args(model) + (c.tied ? " --tie-embeddings" : "") +
                             " --schedule " + c.schedule + " --optimizer " + c.optimizer +
                             " --batch-size 8 --microbatches 4 --warmup-steps 6 --quiet";
  const auto pp = [](int p, const std::string& cut) {
    return " --pp " + std::to_string(p) + (cut.empty() ? "" : " --stage-layers " + cut);
  };
  auto run = run_train(common + pp(c.resume_pp, "") + " --steps 6 --metrics " +
                           (dir / "whole.jsonl").string() + " --save " + (dir / "whole").string(),
                       dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  run = run_train(common + pp(c.save_pp, c.save_cut) + " --steps 3 --metrics " +
                      (dir / "a.jsonl").string() + " --save " + (dir / "half").string(),
                  dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  if (c.tied) expect_table_stored_once(model, dir / "half", c.optimizer);
  run = run_train(common + pp(c.resume_pp, c.resume_cut) + " --steps 6 --resume " +
                      (dir / "half").string() + " --metrics " + (dir / "b.jsonl").string() +
                      " --save " + (dir / "resumed").string(),
                  dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<double> losses = read_losses(dir / "a.jsonl");
  for (double loss : read_losses(dir / "b.jsonl")) losses.push_back(loss);
  expect_same_losses(losses, read_losses(dir / "whole.jsonl"), 1e-6);
  expect_same_parameters(model, dir / "resumed", dir / "whole", 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Schedules, Resume,
                         ::testing::Values(ResumeCase{"1f1b", 2, 2, "sgd"},
                                           ResumeCase{"zb-v", 2, 2, "adamw"},
                                           ResumeCase{"1f1b", 4, 2, "adamw"},
                                           ResumeCase{"zb-v", 4, 2, "sgd"},
                                           ResumeCase{"1f1b", 2, 4, "adamw", true},
                                           ResumeCase{"zb-v", 4, 1, "sgd", true}));

// Resharding in every direction: to one process, to more ranks, and from one process.
INSTANTIATE_TEST_SUITE_P(Reshard, Resume,
                         ::testing::Values(ResumeCase{"1f1b", 4, 1, "adamw"},
                                           ResumeCase{"1f1b", 2, 4, "sgd"},
                                           ResumeCase{"1f1b", 1, 2, "adamw"}));

// The same ranks, another cut (issue 51: a resume after --partition workers measured the ranks
// again): a slow rank 0's few layers saved, a slow rank 1's resumed.
INSTANTIATE_TEST_SUITE_P(Recut, Resume,
                         ::testing::Values(ResumeCase{"1f1b", 2, 2, "adamw", false, "0-2,3-9",
                                                      "0-6,7-9"},
                                           ResumeCase{"zb-h1", 4, 4, "sgd", true, "0-1,2-3,4-5,6-9",
                                                      "0-4,5-7,8-8,9-9"}));

// --save-every 2 --keep 2 over 5 steps leaves the checkpoint of step 5 at DIR and that of step
// 4 at DIR.step-4 (step 2's is gone), and resuming DIR.step-4 for one step gives step 5's loss.
TEST(Checkpoint, SaveEveryKeepsTheNewest) {
  TempDir dir;
  const std::string common =
      model_args(small_model("gpt")) + " --pp 2 --batch-size 8 --microbatches 4 --quiet";
  const fs::path ckpt = dir / "ckpt";
  auto run = run_train(common + " --steps 5 --save-every 2 --keep 2 --save " + ckpt.string() +
                           " --metrics " + (dir / "m.jsonl").string(),
                       dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(fs::is_regular_file(ckpt / "manifest.json"));
  EXPECT_TRUE(fs::is_regular_file(dir / "ckpt.step-4" / "manifest.json"));
  EXPECT_FALSE(fs::exists(dir / "ckpt.step-2"));
  EXPECT_FALSE(fs::exists(dir / "ckpt.partial"));
  run = run_train(common + " --steps 5 --resume " + (dir / "ckpt.step-4").string() + " --metrics " +
                      (dir / "r.jsonl").string(),
                  dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto whole = read_losses(dir / "m.jsonl"), resumed = read_losses(dir / "r.jsonl");
  ASSERT_EQ(whole.size(), 5u);
  expect_same_losses(resumed, {whole[4]}, 1e-6);
}

// A resume that cannot continue the saved run is refused with exit status 2 before training,
// naming the reason.
TEST(Checkpoint, ResumeRefusesWhatCannotContinue) {
  TempDir dir;
  const std::string common = model_args(small_model("gpt")) + " --microbatches 4 --quiet";
  const std::string one_rank = " --pp 1 --batch-size 8";
  const fs::path ckpt = dir / "ckpt";
  auto run = run_train(common + one_rank + " --steps 2 --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto refused = [&](const std::string& args, const std::string& message) {
    const auto out = run_train(common + args, dir);
    EXPECT_EQ(out.exit_code, 2) << args;
    EXPECT_NE(out.err.find(message), std::string::npos) << out.err;
    EXPECT_EQ(out.out, "") << args;
  };
  const std::string resume = " --resume " + ckpt.string();
  refused(one_rank + resume + " --steps 4 --optimizer adamw",
          "checkpoint has optimizer \"sgd\", flags say \"adamw\"");
  refused(one_rank + resume + " --steps 4 --seed 3", "checkpoint has seed 0, flags say 3");
  refused(" --pp 1 --batch-size 16" + resume + " --steps 4",
          "checkpoint has batch_size 8, flags say 16");
  refused(one_rank + resume + " --steps 2", "the checkpoint is at step 2 and --steps is 2");
  refused(one_rank + resume + " --steps 4 --load " + ckpt.string(), "not both");
  refused(" --pp 2 --batch-size 8 --schedule pipedream --steps 4" + resume,
          "the checkpoint is of a synchronous run (1f1b)");
  refused(one_rank + " --steps 4 --save-every 2", "--save-every and --keep need --save DIR");
  refused(one_rank + " --steps 4 --sync-save", "--sync-save needs --save DIR");
  fs::create_directories(dir / "notes");
  std::ofstream(dir / "notes" / "todo.txt") << "mine";
  refused(one_rank + " --steps 1 --save " + (dir / "notes").string(),
          "is a folder that is not a pptrain");
}

struct AsyncResumeCase {
  std::string schedule;
  std::string ranks;  // --pp and, for the one-process rule, --stages
  // The saving run dies at the start of step 5 instead of ending (its saves synchronous, so
  // that the one of step 3 is surely written by then).
  bool crash;
};

void PrintTo(const AsyncResumeCase& c, std::ostream* out) {
  *out << c.schedule << " " << c.ranks << (c.crash ? " crashed" : "");
}

class AsyncResume : public ::testing::TestWithParam<AsyncResumeCase> {};

// An asynchronous schedule is one list over the whole run, so a run saved after step 3 holds
// microbatches in flight: each rank's stashed or predicted weights, forwards of later steps and
// messages sent but not yet received. --resume with the same flags continues it exactly: steps
// 4 to 6 and the final parameters equal the uninterrupted run's, to 1e-6.
TEST_P(AsyncResume, ASixStepRunSavedAfterStepThreeContinuesExactly) {
  const AsyncResumeCase& c = GetParam();
  TempDir dir;
  const ModelOptions model = small_model("gpt");
  const std::string common = model_args(model) + " --schedule " + c.schedule + " " + c.ranks +
                             " --batch-size 8 --microbatches 4 --warmup-steps 6 --quiet --steps 6";
  auto run = run_train(common + " --metrics " + (dir / "whole.jsonl").string() + " --save " +
                           (dir / "whole").string(),
                       dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const fs::path ckpt = dir / "ckpt";
  run = run_train(
      common + " --save-every 3 --keep 2 --save " + ckpt.string() + (c.crash ? " --sync-save" : ""),
      dir, c.crash ? "PPTRAIN_TEST_CRASH_RANK=0 PPTRAIN_TEST_CRASH_STEP=4 " : "");
  if (c.crash) {
    ASSERT_NE(run.exit_code, 0);
  } else {
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  const fs::path half = c.crash ? ckpt : dir / "ckpt.step-3";
  run = run_train(common + " --resume " + half.string() + " --metrics " +
                      (dir / "resumed.jsonl").string() + " --save " + (dir / "resumed").string(),
                  dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<double> whole = read_losses(dir / "whole.jsonl");
  ASSERT_EQ(whole.size(), 6u);
  expect_same_losses(read_losses(dir / "resumed.jsonl"), {whole[3], whole[4], whole[5]}, 1e-6);
  expect_same_parameters(model, dir / "resumed", dir / "whole", 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, AsyncResume,
    ::testing::Values(
        AsyncResumeCase{"pipedream", "--pp 2", false}, AsyncResumeCase{"pipedream", "--pp 4", true},
        AsyncResumeCase{"2bw", "--pp 2", true}, AsyncResumeCase{"2bw", "--pp 4", false},
        AsyncResumeCase{"pipemare", "--pp 2", false}, AsyncResumeCase{"pipemare", "--pp 4", false},
        AsyncResumeCase{"xpipe", "--pp 4", false}, AsyncResumeCase{"spectrain", "--pp 2", false},
        AsyncResumeCase{"ampnet", "--pp 4", false}, AsyncResumeCase{"wpipe", "--pp 2", false},
        AsyncResumeCase{"pipedream", "--pp 1 --stages 4", false}));

// --max-restarts: a worker killed (abort) at step 4 of 6 once; the launcher stops the others,
// starts the group again from the newest whole checkpoint (step 2, --save-every 2) and the run
// ends where an uninterrupted one does, synchronous (1f1b) and asynchronous (pipedream, which
// continues its microbatches in flight). The saves are synchronous here: a background save of
// step 2 may still be on its way when the worker dies at the start of step 4 (the soak covers
// that: tests/soak_test.cpp).
TEST(Restarts, AFailedRunStartsAgainFromTheNewestCheckpoint) {
  for (const std::string schedule : {"1f1b", "pipedream"}) {
    SCOPED_TRACE(schedule);
    TempDir dir;
    const ModelOptions model = small_model("gpt");
    const std::string common = model_args(model) + " --schedule " + schedule +
                               " --pp 2 --batch-size 8 --microbatches 4 --quiet --steps 6";
    auto run = run_train(common + " --save " + (dir / "whole").string(), dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    run = run_train(
        common + " --save-every 2 --sync-save --max-restarts 2 --save " + (dir / "ckpt").string(),
        dir,
        "PPTRAIN_TEST_CRASH_RANK=1 PPTRAIN_TEST_CRASH_STEP=3 PPTRAIN_TEST_CRASH_ONCE=" +
            (dir / "crashed").string() + " ");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(run.err.find("pptrain: restart 1/2 after: worker rank 1 was killed by signal 6"),
              std::string::npos)
        << run.err;
    EXPECT_NE(run.err.find("resuming from step 2 of " + (dir / "ckpt").string()), std::string::npos)
        << run.err;
    EXPECT_EQ(run.err.find("restart 2/2"), std::string::npos) << run.err;
    expect_same_parameters(model, dir / "ckpt", dir / "whole", 1e-6);
  }
}

// A worker that fails every time uses up the restarts: exit 1 naming it and the count. And
// --resume auto continues the newest whole checkpoint: one with a flipped byte is passed over,
// naming the file, for the copy --keep left beside it.
TEST(Restarts, ExhaustedRestartsAndResumeAuto) {
  TempDir dir;
  const std::string common = model_args(small_model("gpt")) +
                             " --schedule 1f1b --pp 2 --batch-size 8 --microbatches 4 --quiet";
  const fs::path ckpt = dir / "ckpt";
  auto run =
      run_train(common + " --steps 4 --save-every 2 --max-restarts 2 --save " + ckpt.string(), dir,
                "PPTRAIN_TEST_CRASH_RANK=0 PPTRAIN_TEST_CRASH_STEP=3 ");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("restart 1/2 after: worker rank 0 was killed by signal 6"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("restart 2/2 after:"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("pptrain: error: worker rank 0 was killed by signal 6"), std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("(after 2 restarts)"), std::string::npos) << run.err;

  run = run_train(common + " --steps 4 --save-every 2 --keep 2 --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  {
    std::fstream layer(ckpt / "layer_0.pt", std::ios::in | std::ios::out | std::ios::binary);
    layer.seekg(100);
    const char byte = static_cast<char>(layer.get());
    layer.seekp(100);
    layer.put(static_cast<char>(byte ^ 0x40));
  }
  run = run_train(common + " --steps 6 --resume auto --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("--resume auto: passing over a checkpoint: --resume: '" +
                         (ckpt / "layer_0.pt").string() + "' is damaged"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("--resume auto: continuing from step 2 of " + ckpt.string() + ".step-2"),
            std::string::npos)
      << run.err;
  // With no checkpoint at all it starts afresh, and says so.
  run = run_train(common + " --steps 1 --resume auto --save " + (dir / "new").string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("--resume auto: no checkpoint to continue in " + (dir / "new").string() +
                         ": starting at step 0"),
            std::string::npos)
      << run.err;
}

// pptrain run --max-restarts: any program's ranks are started again after a failure (rank 1
// fails in the first attempt only: TORCHELASTIC_RESTART_COUNT tells it which attempt it is);
// a program that keeps failing uses the restarts up; exit status 2 (bad input) is final.
TEST(Restarts, PptrainRunStartsTheProgramAgain) {
  TempDir dir;
  auto run = run_pptrain(
      "run --nproc 2 --max-restarts 2 sh -c "
      "'[ \"$RANK$TORCHELASTIC_RESTART_COUNT\" = 10 ] && exit 3; exit 0'",
      dir);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("pptrain: restart 1/2 after: worker rank 1 exited with status 3"),
            std::string::npos)
      << run.err;
  EXPECT_EQ(run.err.find("restart 2/2"), std::string::npos) << run.err;
  run = run_pptrain("run --nproc 2 --max-restarts 1 sh -c '[ $RANK = 0 ] && exit 3; exit 0'", dir);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("(after 1 restart)"), std::string::npos) << run.err;
  run = run_pptrain("run --nproc 2 --max-restarts 3 sh -c 'exit 2'", dir);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(run.err.find("restart"), std::string::npos) << run.err;
}

// A background save (the default) writes what a synchronous one (--sync-save) writes, although
// training goes on while it writes (PPTRAIN_TEST_SAVE_DELAY_MS holds the writing back for more
// than a step): the checkpoint after step 2 has the same parameter files (and state in flight)
// byte for byte, and runs resumed from the two end with the same parameters bit for bit; 1f1b
// with AdamW's moments, pipedream with its weight versions and microbatches in flight. Every
// metrics line has checkpoint_stall_s, above 0 where the step saved.
TEST(BackgroundSave, WritesWhatASynchronousSaveWrites) {
  for (const std::string schedule : {"1f1b --optimizer adamw", "pipedream"}) {
    SCOPED_TRACE(schedule);
    TempDir dir;
    const std::string common = model_args(small_model("gpt")) + " --schedule " + schedule +
                               " --pp 2 --batch-size 8 --microbatches 4 --quiet --steps 4";
    for (const std::string mode : {"background", "sync"}) {
      const std::string flags = mode == "sync" ? " --sync-save" : "";
      auto run =
          run_train(common + flags + " --save-every 2 --keep 2 --metrics " +
                        (dir / (mode + ".jsonl")).string() + " --save " + (dir / mode).string(),
                    dir, "PPTRAIN_TEST_SAVE_DELAY_MS=300 ");
      ASSERT_EQ(run.exit_code, 0) << run.err;
      run = run_train(common + " --resume " + (dir / (mode + ".step-2")).string() + " --save " +
                          (dir / (mode + "-resumed")).string(),
                      dir);
      ASSERT_EQ(run.exit_code, 0) << run.err;
    }
    const auto background = folder_contents(dir / "background.step-2");
    const auto sync = folder_contents(dir / "sync.step-2");
    EXPECT_TRUE(same_parameters(background, sync));
    // The state in flight, tensor by tensor (a copy does not share storage as the originals
    // may, so the files' bytes can differ).
    for (const auto& [name, bytes] : background) {
      if (name.rfind("in_flight", 0) != 0) continue;
      const NamedTensors got = read_tensor_file((dir / "background.step-2" / name).string(), "");
      const NamedTensors want = read_tensor_file((dir / "sync.step-2" / name).string(), "");
      ASSERT_EQ(got.size(), want.size()) << name;
      for (const auto& [key, tensor] : want) {
        EXPECT_TRUE(got.count(key) && torch::equal(got.at(key), tensor)) << name << " " << key;
      }
    }
    EXPECT_TRUE(same_parameters(folder_contents(dir / "background-resumed"),
                                folder_contents(dir / "sync-resumed")));
    EXPECT_TRUE(same_parameters(folder_contents(dir / "background-resumed"),
                                folder_contents(dir / "background")));
    const auto stalls = read_field(dir / "background.jsonl", "checkpoint_stall_s");
    ASSERT_EQ(stalls.size(), 4u);
    EXPECT_EQ(stalls[0], 0);
    EXPECT_GT(stalls[1], 0);
    EXPECT_EQ(stalls[2], 0);
    EXPECT_GT(stalls[3], 0);
  }
}

// A save into a full file system (a small tmpfs mounted in the test's own mount namespace): the
// run stops with one line naming the file and the room left, exit status 1, with a background
// and a synchronous save; the checkpoint before it stays whole and loads. Skipped where a mount
// namespace cannot be made (no unshare, not root).
TEST(BackgroundSave, AFullDiskStopsTheRunAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string common =
      model_args(small_model("gpt")) + " --pp 2 --batch-size 8 --microbatches 4 --quiet";
  if (std::system("unshare -m true 2>/dev/null") != 0) {
    GTEST_SKIP() << "cannot make a mount namespace here (unshare -m)";
  }
  // One checkpoint's size (with its optimizer state), to size the file system at 1.5 of them.
  auto run = run_train(common + " --steps 1 --save " + (dir / "sized").string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir / "sized")) bytes += entry.file_size();
  const fs::path disk = dir / "disk";
  fs::create_directories(disk);
  for (const std::string flags : {"", " --sync-save"}) {
    SCOPED_TRACE(flags.empty() ? "background" : "sync");
    const fs::path ckpt = disk / "ckpt";
    const std::string inside =
        "mount -t tmpfs -o size=" + std::to_string(bytes * 3 / 2 / 1024) + "k tmpfs " +
        disk.string() + " || exit 77; " + PPTRAIN_BINARY + " train " + common + flags +
        " --steps 3 --save-every 1 --save " + ckpt.string() + " 2> " + (dir / "err").string() +
        "; echo $? > " + (dir / "code").string() + "; " + PPTRAIN_BINARY + " train " + common +
        " --steps 1 --load " + ckpt.string() + " 2> " + (dir / "load_err").string() +
        "; echo $? > " + (dir / "load_code").string() + "; cat " + ckpt.string() +
        "/manifest.json > " + (dir / "manifest").string() + "; exit 0";
    const int status = std::system(("unshare -m sh -c '" + inside + "'").c_str());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace of its own here";
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    const std::string err = read_text(dir / "err");
    EXPECT_EQ(read_text(dir / "code"), "1\n") << err;
    EXPECT_EQ(err.rfind("pptrain: error: ", 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find("cannot write checkpoint file '" + ckpt.string() + ".partial/"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("No space left on device ("), std::string::npos) << err;
    EXPECT_NE(err.find(" free of "), std::string::npos) << err;
    EXPECT_EQ(read_text(dir / "load_code"), "0\n") << read_text(dir / "load_err");
    EXPECT_NE(read_text(dir / "manifest").find("\"step\": 1"), std::string::npos);
  }
}

// What an asynchronous checkpoint cannot continue is refused with exit status 2 before
// training: other flags that shape the run's list, a checkpoint saved at the run's end, and a
// synchronous resume of microbatches in flight (ResumeRefusesWhatCannotContinue refuses an
// asynchronous resume of a synchronous checkpoint). A run whose
// ranks cannot all stop after a step (wpipe on 4 ranks) refuses --save-every.
TEST(Checkpoint, AsynchronousResumeRefusesWhatCannotContinue) {
  TempDir dir;
  const std::string common = model_args(small_model("gpt")) +
                             " --batch-size 8 --microbatches 4 --quiet --schedule pipemare";
  const fs::path ckpt = dir / "ckpt";
  auto run =
      run_train(common + " --pp 2 --steps 4 --save-every 2 --keep 2 --save " + ckpt.string(), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto refused = [&](const std::string& args, const std::string& message) {
    const auto out = run_train(args, dir);
    EXPECT_EQ(out.exit_code, 2) << args;
    EXPECT_NE(out.err.find(message), std::string::npos) << out.err;
    EXPECT_EQ(out.out, "") << args;
  };
  const std::string half = " --resume " + (dir / "ckpt.step-2").string();
  refused(common + " --pp 2 --steps 6" + half, "checkpoint has steps 4, flags say 6");
  refused(common + " --pp 4 --steps 4" + half, "checkpoint has pp 2, flags say 4");
  refused(common + " --pp 2 --steps 6 --resume " + ckpt.string(),
          "saved at the end of an asynchronous run of 4 steps");
  const std::string sync =
      model_args(small_model("gpt")) + " --batch-size 8 --microbatches 4 --quiet --pp 2";
  refused(sync + " --steps 4" + half,
          "holds microbatches in flight of an asynchronous run (pipemare)");
  refused(model_args(small_model("gpt")) + " --batch-size 8 --microbatches 4 --schedule wpipe " +
              "--pp 4 --steps 4 --save-every 2 --save " + (dir / "w").string(),
          "--save-every: in wpipe a rank needs");
}
}  // namespace
}  // namespace pptrain
