// The chaos soak: a run killed many times ends exactly where an uninterrupted one does.
//
// A run of gpt on 4 ranks with --save-every and --max-restarts 10 is hit by kill -9 at moments
// drawn from a seed: a worker (the launcher starts the group again from the newest whole
// checkpoint) or the launcher itself (its workers die with it, and it is started again with
// --resume auto, as a cluster's job scheduler would), some of them while a save is being
// written. In the tests it is short (30 steps, 5 kills, one seed, 1f1b and pipedream);
// bench/chaos_soak.sh runs it long through the environment: PPTRAIN_SOAK_STEPS (200),
// PPTRAIN_SOAK_SEEDS (3), PPTRAIN_SOAK_KILLS (5), PPTRAIN_SOAK_SCHEDULES ("1f1b zb-v pipedream").
// PPTRAIN_SOAK_VERBOSE=1 prints each soaked run's log.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;
using Clock = std::chrono::steady_clock;

int env_or(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

// The step of the checkpoint in `dir` (-1 when there is none yet).
int saved_step(const fs::path& dir) {
  try {
    return nlohmann::json::parse(read_text(dir / "manifest.json")).value("step", -1);
  } catch (const std::exception&) {
    return -1;
  }
}

// Starts `command` through sh (exec'd, so the returned pid is the launcher's own).
pid_t start(const std::string& command) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits until `done` holds, at most `limit`; returns whether it did.
template <typename Done>
bool wait_until(Done done, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// A launcher we started: whether it has exited, and its exit status then.
struct Launcher {
  pid_t pid = -1;
  bool over = false;
  int code = -1;

  bool exited() {
    int status = 0;
    if (!over && waitpid(pid, &status, WNOHANG) == pid) {
      over = true;
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return over;
  }
  void kill_now() {
    if (exited()) return;
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    over = true;
    code = 128 + SIGKILL;
  }
};

struct SoakResult {
  int worker_kills = 0, launcher_kills = 0;
  int exit_code = -1;
  std::string log;
};

// One soaked run of `args` into `ckpt`: `kills` kill -9s drawn from `seed`, spread over the run's
// checkpoints; returns what happened. The run is slowed down only by
// PPTRAIN_TEST_SAVE_PAUSE_MS (each save takes a few hundred ms), so that a kill can land
// during a save.
SoakResult soak(const std::string& args, const fs::path& ckpt, int steps, int save_every, int kills,
                unsigned seed) {
  std::mt19937 random(seed);
  const fs::path partial = ckpt.string() + ".partial";
  const std::string log = ckpt.string() + ".log";  // one per soaked run
  const std::string command = "env PPTRAIN_TEST_SAVE_PAUSE_MS=60 " + std::string(PPTRAIN_BINARY) +
                              " train " + args + " --save-every " + std::to_string(save_every) +
                              " --max-restarts 10 --save " + ckpt.string() + " >/dev/null 2>>" +
                              log;
  SoakResult result;
  Launcher launcher{start(command)};
  for (int kill_index = 0; kill_index < kills; ++kill_index) {
    // Each kill waits for the run to pass its share of the checkpoints, then for a moment drawn
    // from the seed: at once, a little later, or in the middle of the next save.
    const int checkpoints = steps / save_every;
    const int after = (kill_index + 1) * checkpoints / (kills + 1) * save_every;
    wait_until([&] { return saved_step(ckpt) >= after || launcher.exited(); },
               std::chrono::seconds(120));
    if (launcher.exited()) break;  // over (or failed) before this kill
    const int moment = static_cast<int>(random() % 3);
    if (moment == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(random() % 400));
    } else if (moment == 2) {
      wait_until([&] { return fs::exists(partial); }, std::chrono::seconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(random() % 150));
    }
    std::vector<pid_t> workers;
    for (pid_t pid : processes_mentioning(ckpt.string())) {
      if (pid != launcher.pid) workers.push_back(pid);
    }
    if (random() % 3 == 0 || workers.empty()) {
      launcher.kill_now();
      ++result.launcher_kills;
      // Its workers die with it (PR_SET_PDEATHSIG); then it is started again.
      wait_until([&] { return processes_mentioning(ckpt.string()).empty(); },
                 std::chrono::seconds(20));
      std::ofstream(log, std::ios::app) << "soak: killed the launcher; starting it again\n";
      launcher = Launcher{start(command + " --resume auto")};
    } else {
      kill(workers[random() % workers.size()], SIGKILL);
      ++result.worker_kills;
    }
  }
  if (!wait_until([&] { return launcher.exited(); }, std::chrono::seconds(240))) {
    launcher.kill_now();
  }
  const int code = launcher.code;
  result.exit_code = code;
  result.log = read_text(log);
  return result;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Killed many times, a run ends with the parameters of the uninterrupted run (to 1e-6): 1f1b
// and pipedream (whose microbatches in flight are in its checkpoints; and zb-v in the bench) on
// 4 ranks; every kill of a worker is followed by one restart, every kill of the launcher by a
// --resume auto; no process is left.
TEST(Soak, ARunKilledManyTimesEndsWhereAnUninterruptedOneDoes) {
  const int steps = env_or("PPTRAIN_SOAK_STEPS", 30);
  const int seeds = env_or("PPTRAIN_SOAK_SEEDS", 1);
  const int kills = env_or("PPTRAIN_SOAK_KILLS", 5);
  const int save_every = std::max(1, steps / 20);
  const char* listed = std::getenv("PPTRAIN_SOAK_SCHEDULES");
  const ModelOptions model = small_model("gpt");
  for (const std::string& schedule : words(listed && *listed ? listed : "1f1b pipedream")) {
    TempDir dir;
    const std::string args = model_args(model) + " --schedule " + schedule +
                             " --pp 4 --batch-size 8 --microbatches 4 --quiet --steps " +
                             std::to_string(steps);
    auto run = run_train(args + " --save " + (dir / "whole").string(), dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    for (int seed = 1; seed <= seeds; ++seed) {
      SCOPED_TRACE(schedule + ", seed " + std::to_string(seed));
      const fs::path ckpt = dir / ("soaked-" + std::to_string(seed));
      const SoakResult soaked =
          soak(args, ckpt, steps, save_every, kills,
               static_cast<unsigned>(seed * 1000 + std::hash<std::string>()(schedule) % 1000));
      std::printf("soak %s seed %d: %d workers and %d launchers killed, exit %d\n",
                  schedule.c_str(), seed, soaked.worker_kills, soaked.launcher_kills,
                  soaked.exit_code);
      if (env_or("PPTRAIN_SOAK_VERBOSE", 0)) std::printf("%s", soaked.log.c_str());
      EXPECT_EQ(soaked.exit_code, 0) << soaked.log;
      EXPECT_EQ(soaked.worker_kills + soaked.launcher_kills, kills) << soaked.log;
      // A killed worker's group is started again (or, killed after the last save, found
      // complete); a killed launcher's run continues with --resume auto.
      EXPECT_EQ(count_of(soaked.log, "; resuming from step ") +
                    count_of(soaked.log, "pptrain: no restart after: "),
                static_cast<size_t>(soaked.worker_kills))
          << soaked.log;
      EXPECT_EQ(count_of(soaked.log, "pptrain: --resume auto: ") -
                    count_of(soaked.log, "pptrain: --resume auto: passing over"),
                static_cast<size_t>(soaked.launcher_kills))
          << soaked.log;
      expect_same_parameters(model, ckpt, dir / "whole", 1e-6);
      EXPECT_TRUE(processes_mentioning(ckpt.string()).empty());
      fs::remove_all(ckpt);
    }
  }
}

// A long run leaks nothing (bench/chaos_soak.sh: 2,000 steps, --save-every 50): with --keep 3
// at most 3 checkpoints stay on disk, and each rank's resident memory after the last step is
// within 5% of its value after step 100. PPTRAIN_SOAK_LONG_STEPS (300) and
// PPTRAIN_SOAK_LONG_SAVE_EVERY (10) size it.
TEST(Soak, ALongRunLeaksNothing) {
  const int steps = std::max(101, env_or("PPTRAIN_SOAK_LONG_STEPS", 300));
  const int save_every = env_or("PPTRAIN_SOAK_LONG_SAVE_EVERY", 10);
  TempDir dir;
  const fs::path ckpt = dir / "ckpt", metrics = dir / "m.jsonl";
  const auto run =
      run_train(model_args(small_model("gpt")) +
                    " --schedule 1f1b --pp 4 --batch-size 8 --microbatches 4 "
                    "--quiet --steps " +
                    std::to_string(steps) + " --save-every " + std::to_string(save_every) +
                    " --keep 3 --save " + ckpt.string() + " --metrics " + metrics.string(),
                dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  int checkpoints = 0;
  for (const auto& entry : fs::directory_iterator(ckpt.parent_path())) {
    const std::string name = entry.path().filename().string();
    checkpoints += name == "ckpt" || name.rfind("ckpt.step-", 0) == 0;
    EXPECT_NE(name, "ckpt.partial");
  }
  EXPECT_EQ(checkpoints, 3);
  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), static_cast<size_t>(steps));
  const auto early = lines[99].at("resident_bytes").get<std::vector<double>>();
  const auto late = lines.back().at("resident_bytes").get<std::vector<double>>();
  ASSERT_EQ(early.size(), 4u);
  for (size_t rank = 0; rank < early.size(); ++rank) {
    std::printf("rank %zu resident after step 100: %.1f MiB, after step %d: %.1f MiB (%.2f%%)\n",
                rank, early[rank] / (1 << 20), steps, late[rank] / (1 << 20),
                100.0 * (late[rank] - early[rank]) / early[rank]);
    EXPECT_GT(early[rank], 0);
    EXPECT_LE(std::abs(late[rank] - early[rank]), 0.05 * early[rank]) << "rank " << rank;
  }
}

}  // namespace
}  // namespace pptrain
