// Starts and supervises the worker processes of a local multi-process run.
//
// `pptrain train --pp 4 ...` without RANK in the environment starts 4 workers with the same
// arguments and the environment torchrun would give each worker (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>, ...: cluster_env.h's torchrun_variables(); on
// one node of several, LaunchOptions::node's ranks and master) plus one compute thread per process
// (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1): each is the program executed again, or, with
// LaunchOptions::run_in_child, this process forked, which saves loading LibTorch once per worker.
// If a worker fails (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after
// `kill_grace`; Ctrl-C (SIGINT/SIGTERM to the launcher) does the same. Workers also die with the
// launcher (PR_SET_PDEATHSIG).
//
//   if (!running_as_worker()) return launch_workers(LaunchOptions{4, argv_vector});
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/runtime/cluster_env.h"

namespace pptrain {

struct LaunchOptions {
  int workers = 1;
  std::vector<std::string> args;  // argv[1..] passed to every worker; argv[0] is /proc/self/exe
  std::string executable = "/proc/self/exe";
  std::chrono::milliseconds kill_grace = std::chrono::seconds(3);  // SIGTERM -> SIGKILL
  // A worker stopped (SIGSTOP, SIGTSTP: state T in /proc) this long stops the run, named.
  std::chrono::milliseconds stopped_timeout = std::chrono::seconds(60);
  // Read the workers' stderr through pipes and hold back their error lines ("pptrain: error:
  // ..."), so that a failed run reports one line naming its cause, with the cause's own message
  // (see LaunchResult::message); other lines pass on as they come. Off: the workers write to our
  // stderr directly (`pptrain run`, whose programs print what they like).
  bool hold_error_lines = true;
  // Restarts of the run so far: TORCHELASTIC_RESTART_COUNT in the workers' environment, as
  // torchrun sets it (launch_with_restarts counts them).
  int restart_count = 0;
  int max_restarts = 0;  // TORCHELASTIC_MAX_RESTARTS, as torchrun sets it
  // This node's place in a run over several nodes (runtime/rendezvous.h): the workers are its
  // ranks first_rank.. of world_size, and meet at its master. Unset: the workers are the whole
  // run, meeting at 127.0.0.1 on a free port. A master_port of 0 is a free port too.
  std::optional<NodeAssignment> node;
  // When set, a worker is this process forked rather than `executable` run again: the child
  // takes the environment above, the default action of SIGINT and SIGTERM, closes the
  // descriptors an exec would, and exits with run_in_child(args) (its output flushed). It
  // saves each worker the start of a program that loads LibTorch (0.6-0.8 s of CPU here). Only
  // for a launcher that has started no thread of its own (a forked child keeps one thread), nor
  // run an OpenMP team of more than one (a child's next parallel region would wait for the
  // team's missing threads forever), and whose run_in_child does what the program would do
  // with `args`.
  std::function<int(const std::vector<std::string>& args)> run_in_child;
  // When set, asked about every 250 ms while the workers run: a reason it returns (non-empty)
  // stops them as a failure does, and the launch fails with it (LaunchResult::message), say to
  // meet the other nodes again for one that asks to join (runtime/rendezvous.h).
  std::function<std::string()> stop_for;
};

// A worker's error message that contains these words is a consequence of another rank's
// failure, never taken for the cause of the run's (LaunchResult::message).
inline constexpr const char* kAnotherRankFailed = "another rank failed";

// What happened to the workers.
struct LaunchResult {
  int exit_code = 0;  // 0 if every worker exited with 0; else the code the launcher exits with
  // Empty on success; else one line naming the failed rank(s), the cause first: a worker killed
  // by a signal, else the first that reported an error of its own (its message follows, "worker
  // rank 1 exited with status 1: <its error>"), else the first to fail.
  std::string message;
};

// True when this process is one rank of a multi-process run started by us, torchrun, srun or
// mpirun (cluster_env.h); `hint`: the command line's --master-addr/--master-port.
bool running_as_worker(const MasterHint& hint = {});

// A TCP port that was free on every address a moment ago, drawn below the kernel's ephemeral
// range so that no outgoing connection takes it before rank 0 binds it.
int find_free_port();

// True when a listening socket could bind `port` on every address a moment ago.
bool port_is_free(int port);

// Spawns and supervises the workers; returns when all have exited (or were killed).
LaunchResult launch_workers(const LaunchOptions& options);

// launch_workers(), and while the run fails for any reason but bad input (exit status 2), at
// most `max_restarts` times: before_restart(k, failed) (which may change `options`, say to
// resume from a checkpoint) and the group started again, k = 1, 2, ... Returns the last result;
// a success when before_restart() returns false (the failed run had nothing left to do).
LaunchResult launch_with_restarts(
    LaunchOptions& options, int max_restarts,
    const std::function<bool(int restart, const LaunchResult& failed)>& before_restart);
// What a failed run of launch_with_restarts() says: its message, and "(after N restarts)" when
// it used them up.
std::string failure_text(const LaunchResult& result, int max_restarts);

}  // namespace pptrain
