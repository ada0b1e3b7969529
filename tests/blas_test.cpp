// End-to-end tests of the BLAS kernels pptrain chooses for this CPU (common/blas_kernels.h): the
// real `pptrain train`, with OPENBLAS_VERBOSE=2 so that OpenBLAS itself says which kernels ran
// ("Core: X" on stderr as it loads), against the same run on Prescott's kernels
// (PPTRAIN_BLAS=system OPENBLAS_CORETYPE=Prescott): the line in the run's header names what ran,
// and the losses are the same to 1e-5. No timing is asserted (bench/blas_bench.sh measures the
// speed).
//
// This program links pptrain::plan only, no LibTorch: so that its own probes of OpenBLAS (which
// kernels the library holds, which this CPU runs) load a fresh OpenBLAS in each child.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "pptrain/common/blas_kernels.h"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

// Every setting of the choice cleared, as on a machine where nobody set any.
const std::string kClean =
    "env -u OPENBLAS_CORETYPE -u PPTRAIN_BLAS -u PPTRAIN_BLAS_CHOICE -u PPTRAIN_BLAS_TEST_DETECTED "
    "OPENBLAS_VERBOSE=2 ";
const std::string kModel =
    "--model gpt --layers 4 --d-model 64 --heads 4 --seq-len 32 --batch-size 8 --microbatches 4 "
    "--steps 3 --pp 1 --schedule 1f1b";

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class Scratch {
 public:
  Scratch() {
    std::string pattern = (fs::temp_directory_path() / "pptrain_blas_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

struct TrainRun {
  int exit_code = -1;
  std::string out, err;
  std::vector<double> losses;
  // The header's BLAS line, and the kernels OpenBLAS said it loaded, in order.
  std::string blas_line;
  int blas_lines = 0;
  std::vector<std::string> cores;
};

// `<env> <program> train <kModel> --metrics ...`, its output kept in `dir` under `name`.
TrainRun train(const std::string& env, const std::string& program, const Scratch& dir,
               const std::string& name) {
  const fs::path metrics = dir / (name + ".jsonl"), out = dir / (name + ".out"),
                 err = dir / (name + ".err");
  const std::string command = kClean + env + " " + program + " train " + kModel + " --metrics " +
                              metrics.string() + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(command.c_str());
  TrainRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = read_text(out);
  run.err = read_text(err);
  std::istringstream lines(run.out + "\n" + run.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("BLAS: ", 0) == 0) {
      run.blas_line = line;
      ++run.blas_lines;
    }
    // OpenBLAS's own "Core: Haswell", as it loads.
    if (line.rfind("Core: ", 0) == 0) run.cores.push_back(line.substr(6));
  }
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    run.losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return run;
}

void expect_same_losses(const TrainRun& got, const TrainRun& want) {
  ASSERT_EQ(got.losses.size(), 3u) << got.err;
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << "step " << i + 1;
  }
}

// What this machine's OpenBLAS does by itself, and the best set pptrain should pick when
// OpenBLAS's own is Prescott (empty when there is none, or no OpenBLAS).
struct Machine {
  OpenBlasState own;
  std::string best_above_prescott;
  std::string expected_by_itself;  // what a run with no settings should run
};
// The first of `candidates` that OpenBLAS loads when asked (0.3.21 cannot be asked for
// Cooperlake: it falls back to its own detection), or `otherwise`.
std::string first_loaded(const std::vector<std::string>& candidates, const std::string& otherwise) {
  for (const std::string& name : candidates) {
    if (probe_openblas({name}).at(0).kernels == name) return name;
  }
  return otherwise;
}
Machine this_machine() {
  Machine machine;
  machine.own = probe_openblas({""}).at(0);
  if (!machine.own.loaded) return machine;
  const CpuFeatures cpu = cpu_features();
  machine.best_above_prescott =
      first_loaded(better_kernels(cpu, "Prescott", machine.own.available), "");
  machine.expected_by_itself = first_loaded(
      better_kernels(cpu, machine.own.kernels, machine.own.available), machine.own.kernels);
  return machine;
}

const std::string kPptrain = PPTRAIN_BINARY;
const std::string kRuntime = (fs::path(PPTRAIN_BINARY).parent_path() / "pptrain-runtime").string();

class BlasKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    machine_ = this_machine();
    if (!machine_.own.loaded) GTEST_SKIP() << "no OpenBLAS (libopenblas.so.0) on this machine";
    if (machine_.own.available.empty()) GTEST_SKIP() << "this OpenBLAS has one kernel set only";
  }
  // The run on Prescott's kernels every case compares with.
  TrainRun prescott(const Scratch& dir) {
    TrainRun run =
        train("PPTRAIN_BLAS=system OPENBLAS_CORETYPE=Prescott", kPptrain, dir, "prescott");
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.cores, std::vector<std::string>{"Prescott"}) << run.err;
    EXPECT_EQ(run.blas_line,
              "BLAS: " + machine_.own.version +
                  " with Prescott kernels, as OPENBLAS_CORETYPE asks (PPTRAIN_BLAS=system)");
    return run;
  }
  Machine machine_;
};

// The test: with no settings, `pptrain train` runs the best kernels for this CPU, says so
// in one line, and computes the same losses as on Prescott's.
TEST_F(BlasKernels, NoSettingsRunTheBestKernelsAndTheSameLosses) {
  Scratch dir;
  const TrainRun slow = prescott(dir);
  const TrainRun run = train("", kPptrain, dir, "default");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.blas_lines, 1) << run.out;
  EXPECT_EQ(run.cores, std::vector<std::string>{machine_.expected_by_itself}) << run.err;
  const std::string head =
      "BLAS: " + machine_.own.version + " with " + machine_.expected_by_itself + " kernels, ";
  EXPECT_EQ(run.blas_line.rfind(head, 0), 0u) << run.blas_line;
  expect_same_losses(run, slow);
}

// A CPU OpenBLAS does not know, as on the Xeon: OpenBLAS's own choice is Prescott (the
// tests' stand-in) and pptrain replaces it, in the planner, before pptrain-runtime loads.
TEST_F(BlasKernels, OnACpuOpenBlasDoesNotKnowPptrainChoosesAndSays) {
  if (machine_.best_above_prescott.empty()) GTEST_SKIP() << "this CPU runs nothing above Prescott";
  Scratch dir;
  const TrainRun slow = prescott(dir);
  const TrainRun run = train("OPENBLAS_CORETYPE=Prescott PPTRAIN_BLAS_TEST_DETECTED=Prescott",
                             kPptrain, dir, "chosen");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.cores, std::vector<std::string>{machine_.best_above_prescott}) << run.err;
  const std::string head = "BLAS: " + machine_.own.version + " with " +
                           machine_.best_above_prescott +
                           " kernels, chosen by pptrain for this CPU and checked (OpenBLAS's "
                           "own choice: Prescott; ";
  EXPECT_EQ(run.blas_line.rfind(head, 0), 0u) << run.blas_line;
  const std::string tail = "; PPTRAIN_BLAS=system keeps it)";
  EXPECT_TRUE(run.blas_line.size() > tail.size() &&
              run.blas_line.compare(run.blas_line.size() - tail.size(), tail.size(), tail) == 0)
      << run.blas_line;
  expect_same_losses(run, slow);
}

// pptrain-runtime started directly: OpenBLAS is loaded with Prescott's kernels before main, so
// the program starts itself once more with the better set, which it checks there.
TEST_F(BlasKernels, TheRuntimeStartedDirectlyStartsOnceMore) {
  if (machine_.best_above_prescott.empty()) GTEST_SKIP() << "this CPU runs nothing above Prescott";
  Scratch dir;
  const TrainRun slow = prescott(dir);
  const TrainRun run = train("OPENBLAS_CORETYPE=Prescott PPTRAIN_BLAS_TEST_DETECTED=Prescott",
                             kRuntime, dir, "again");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.cores, (std::vector<std::string>{"Prescott", machine_.best_above_prescott}))
      << run.err;
  EXPECT_NE(run.blas_line.find("chosen by pptrain for this CPU and checked"), std::string::npos)
      << run.blas_line;
  expect_same_losses(run, slow);
}

// A user's OPENBLAS_CORETYPE is theirs, even when the CPU runs better.
TEST_F(BlasKernels, AUsersSettingIsKept) {
  Scratch dir;
  const TrainRun run = train("OPENBLAS_CORETYPE=Prescott", kPptrain, dir, "user");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.cores, std::vector<std::string>{"Prescott"}) << run.err;
  const std::string head =
      "BLAS: " + machine_.own.version + " with Prescott kernels, as OPENBLAS_CORETYPE asks (yours";
  EXPECT_EQ(run.blas_line.rfind(head, 0), 0u) << run.blas_line;
}

TEST(BlasSetting, ABadValueIsOneLineFromEitherProgram) {
  Scratch dir;
  for (const std::string& program : {kPptrain, kRuntime}) {
    const TrainRun run = train("PPTRAIN_BLAS=fast OPENBLAS_VERBOSE=0", program, dir, "bad");
    EXPECT_EQ(run.exit_code, 2) << program;
    EXPECT_EQ(run.err, "pptrain: error: PPTRAIN_BLAS must be 'pptrain' or 'system', got 'fast'\n")
        << program;
  }
}

}  // namespace
}  // namespace pptrain
