#include "pptrain/runtime/launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/lost_peer.h"

namespace pptrain {

namespace {

std::atomic<int> g_interrupt_signal{0};

void on_interrupt(int signal) {
  g_interrupt_signal = signal;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "stopped with wait status " + std::to_string(status);
}

bool failed(int status) {
  return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

// What an exec would do to a forked child that goes on in the same program: the descriptors
// marked close-on-exec closed (the launcher's ends of the other workers' pipes, ...), and the
// signals the launcher catches back to their default action.
void forget_launcher_state() {
  std::vector<int> close_on_exec;
  if (DIR* fds = opendir("/proc/self/fd")) {
    while (const dirent* entry = readdir(fds)) {
      const int fd = std::atoi(entry->d_name);
      if (fd > STDERR_FILENO && fd != dirfd(fds) && (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0)
        close_on_exec.push_back(fd);
    }
    closedir(fds);
  }
  for (const int fd : close_on_exec) close(fd);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
}

// The child: become worker `rank`, then run the program again, by exec or by
// options.run_in_child. Never returns.
// `stderr_fd`: the write end of the pipe the launcher reads the worker's stderr from, or -1.
[[noreturn]] void start_worker(const LaunchOptions& options, int rank, const NodeAssignment& node,
                               pid_t parent, int stderr_fd) {
  // Die with the launcher even if it is SIGKILLed, so no worker is left waiting on its peers.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  if (stderr_fd >= 0 && dup2(stderr_fd, STDERR_FILENO) < 0) _exit(127);
  const Environment variables =
      torchrun_variables(node, rank, options.workers, options.restart_count, options.max_restarts);
  for (const auto& [name, value] : variables) setenv(name.c_str(), value.c_str(), 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  if (options.run_in_child) {
    forget_launcher_state();
    int status = 1;
    try {
      status = options.run_in_child(options.args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pptrain: error: worker %d: %s\n", node.first_rank + rank, e.what());
    }
    std::fflush(nullptr);
    _exit(status);  // not the launcher's exit handlers and destructors
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(options.executable.c_str()));
  for (const auto& a : options.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(options.executable.c_str(), argv.data());
  std::fprintf(stderr, "pptrain: error: cannot start worker %d (%s): %s\n", node.first_rank + rank,
               options.executable.c_str(), std::strerror(errno));
  _exit(127);
}

// The error lines a worker prints ("pptrain: error: rank 1: ..."), as run_cli() writes them.
bool is_error_line(const std::string& line) {
  return line.rfind("pptrain: error: ", 0) == 0 || line.rfind("pptrain: internal error: ", 0) == 0;
}

// An error a worker reports only because a peer went away first (transport.cpp's waiter): a
// consequence, never the cause of a run's failure.
bool is_consequence(const std::string& line) {
  return line.find("the connection broke") != std::string::npos ||
         line.find(kAnotherRankFailed) != std::string::npos;
}

// The workers' stderr, read through one pipe each. Lines pass on to our stderr as they come,
// except error lines: those wait for the end of the run, so that its first error line is the
// cause (a worker's error message, or the launcher's account of a crash) and not a surviving
// peer's view of it.
class WorkerErrors {
 public:
  struct Line {
    int rank = 0;
    std::string original;  // as the worker wrote it
    std::string text;      // without "pptrain: error: " and the worker's "rank R: "
    bool consequence = false;
  };

  // `first_rank`: the global rank of worker 0, which the workers' own lines name.
  explicit WorkerErrors(int first_rank) : first_rank_(first_rank) {}

  ~WorkerErrors() {
    for (const Pipe& pipe : pipes_) {
      if (pipe.fd >= 0) close(pipe.fd);
    }
  }

  // A pipe for worker `rank` (ranks in order from 0); its write end, for the child, or -1 when
  // no pipe could be made (the worker then writes to our stderr directly).
  int open_pipe() {
    int fds[2];
    pipes_.emplace_back();
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    pipes_.back().fd = fds[0];
    return fds[1];
  }

  // Reads whatever the workers wrote since the last call.
  void drain() {
    char buffer[4096];
    for (size_t rank = 0; rank < pipes_.size(); ++rank) {
      Pipe& pipe = pipes_[rank];
      while (pipe.fd >= 0) {
        const ssize_t n = read(pipe.fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          if (n == 0 || errno != EAGAIN) {  // end of file: the worker (and its children) exited
            close(pipe.fd);
            pipe.fd = -1;
            if (!pipe.pending.empty()) take(static_cast<int>(rank), pipe.pending + "\n");
            pipe.pending.clear();
          }
          break;
        }
        pipe.pending.append(buffer, static_cast<size_t>(n));
        const size_t end = pipe.pending.rfind('\n');
        if (end == std::string::npos) continue;
        take(static_cast<int>(rank), pipe.pending.substr(0, end + 1));
        pipe.pending.erase(0, end + 1);
      }
    }
  }

  // The error lines held back, in the order they arrived.
  const std::vector<Line>& held() const { return held_; }

  // Prints the error lines held back, as the workers wrote them.
  void print_held() const {
    for (const Line& line : held_) std::fprintf(stderr, "%s\n", line.original.c_str());
  }

 private:
  struct Pipe {
    int fd = -1;
    std::string pending;  // a line not yet ended
  };

  // Complete lines of worker `rank`.
  void take(int rank, const std::string& lines) {
    size_t begin = 0;
    while (begin < lines.size()) {
      const size_t end = lines.find('\n', begin);
      const std::string line = lines.substr(begin, end - begin);
      begin = end + 1;
      if (!is_error_line(line)) {
        std::fprintf(stderr, "%s\n", line.c_str());
        continue;
      }
      const bool internal = line.rfind("pptrain: internal error: ", 0) == 0;
      std::string text = line.substr(line.find("error: ") + std::strlen("error: "));
      const std::string own = "rank " + std::to_string(first_rank_ + rank) + ": ";
      if (text.rfind(own, 0) == 0) text.erase(0, own.size());
      if (internal) text = "internal error: " + text;
      held_.push_back({rank, line, text, is_consequence(line)});
    }
    std::fflush(stderr);
  }

  int first_rank_ = 0;
  std::vector<Pipe> pipes_;
  std::vector<Line> held_;
};

}  // namespace

bool running_as_worker(const MasterHint& hint) {
  return is_launched_rank(cluster_env_of_process(hint));
}

namespace {

// True when a listening socket could bind `port` on every address (as rank 0's store does); 0:
// any port, which the kernel picks. Returns the port bound, or 0. Like the stores, it reuses an
// address whose connections wait in TIME_WAIT, which a listener that closed first leaves.
int try_bind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  PPTRAIN_CHECK(fd >= 0, "cannot open a socket to find a free port: ", std::strerror(errno));
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace

bool port_is_free(int port) {
  return try_bind(port) == port;
}

// The port is free now, but rank 0 binds it only after loading LibTorch, a second later. A port
// of the kernel's ephemeral range (ip_local_port_range) may meanwhile become the local end of
// any process's outgoing connection (Gloo's, another run's store clients), so we draw one
// below that range, where the kernel never hands out ports on its own.
int find_free_port() {
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> ephemeral_low;
  constexpr int kLowest = 10000;
  if (ephemeral_low - kLowest >= 1000) {
    std::random_device seed;
    std::mt19937 draw(seed());
    std::uniform_int_distribution<int> port(kLowest, ephemeral_low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int bound = try_bind(port(draw));
      if (bound > 0) return bound;
    }
  }
  const int bound = try_bind(0);
  PPTRAIN_CHECK(bound > 0, "cannot find a free TCP port: ", std::strerror(errno));
  return bound;
}

// True when process `pid` is stopped by a signal (or a tracer): state T or t in /proc/PID/stat.
bool is_stopped(pid_t pid) {
  const char state = process_state(pid);
  return state == 'T' || state == 't';
}

LaunchResult launch_workers(const LaunchOptions& options) {
  PPTRAIN_ASSERT(options.workers >= 1);
  NodeAssignment node;
  if (options.node) {
    node = *options.node;
  } else {
    node.world_size = options.workers;
  }
  if (node.master_port == 0) node.master_port = find_free_port();
  const int first = node.first_rank;  // the global rank of local rank 0
  g_interrupt_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);

  const pid_t self = getpid();
  std::vector<pid_t> pids(options.workers, -1);
  std::vector<int> statuses(options.workers, 0);
  WorkerErrors errors(first);
  std::fflush(nullptr);  // no buffered output duplicated into the children
  for (int rank = 0; rank < options.workers; ++rank) {
    const int stderr_fd = options.hold_error_lines ? errors.open_pipe() : -1;
    const pid_t pid = fork();
    const int fork_errno = errno;
    if (pid == 0) start_worker(options, rank, node, self, stderr_fd);
    if (stderr_fd >= 0) close(stderr_fd);
    PPTRAIN_CHECK(pid >= 0, "cannot start worker ", rank,
                  ": fork failed: ", std::strerror(fork_errno));
    pids[rank] = pid;
  }

  using Clock = std::chrono::steady_clock;
  int running = options.workers;
  std::vector<int> failures;  // ranks, in the order their failure was seen
  bool killing = false;
  bool killed_hard = false;
  Clock::time_point kill_started;
  // Collects one exited worker, if any; false when none is waiting to be collected.
  const auto reap_one = [&] {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return false;
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) return true;  // not one of ours
    const int rank = static_cast<int>(it - pids.begin());
    statuses[rank] = status;
    *it = -1;
    --running;
    // Workers that die after we started killing are consequences, not causes.
    if (failed(status) && !killing) failures.push_back(rank);
    return true;
  };
  const auto signal_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) kill(p, sig);
    }
  };
  // Since when each worker has been seen stopped; a worker stopped past the timeout fails.
  std::vector<std::optional<Clock::time_point>> stopped_since(options.workers);
  std::string stopped_message;
  std::string stop_reason;  // options.stop_for's
  Clock::time_point next_stop_check = Clock::now();
  const auto check_stopped = [&] {
    const auto now = Clock::now();
    if (now < next_stop_check) return;
    next_stop_check = now + std::chrono::milliseconds(250);
    if (options.stop_for && stop_reason.empty()) stop_reason = options.stop_for();
    for (int rank = 0; rank < options.workers; ++rank) {
      if (pids[rank] <= 0 || !is_stopped(pids[rank])) {
        stopped_since[rank].reset();
        continue;
      }
      if (!stopped_since[rank]) stopped_since[rank] = now;
      if (now - *stopped_since[rank] < options.stopped_timeout || !stopped_message.empty())
        continue;
      const auto seconds =
          std::chrono::duration_cast<std::chrono::seconds>(now - *stopped_since[rank]).count();
      stopped_message = "worker rank " + std::to_string(first + rank) +
                        " has been stopped (a SIGSTOP?) for " + std::to_string(seconds) + " s";
    }
  };
  while (running > 0) {
    errors.drain();
    while (running > 0 && reap_one()) {
    }
    if (running == 0) break;
    if (!killing) check_stopped();
    if (!killing && (!failures.empty() || g_interrupt_signal || !stopped_message.empty() ||
                     !stop_reason.empty())) {
      // A peer of a crashed worker fails a moment later (connection closed); reap those too
      // before killing, so the message names every failure and the cause first.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      errors.drain();
      while (running > 0 && reap_one()) {
      }
      killing = true;
      kill_started = Clock::now();
      signal_all(SIGTERM);
      signal_all(SIGCONT);  // a stopped worker acts on SIGTERM only once it runs
    }
    if (killing && !killed_hard && Clock::now() - kill_started > options.kill_grace) {
      killed_hard = true;
      signal_all(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);

  LaunchResult result;
  if (g_interrupt_signal) {  // Ctrl-C kills the workers too; that is not their failure
    result.exit_code = 128 + g_interrupt_signal;
    result.message = std::string("interrupted by signal ") + std::to_string(g_interrupt_signal) +
                     "; stopped all " + std::to_string(options.workers) + " workers";
    return result;
  }
  if (!stopped_message.empty()) {
    result.exit_code = 1;
    result.message = stopped_message + "; stopped the other workers";
    return result;
  }
  if (!stop_reason.empty() && failures.empty()) {
    result.exit_code = 1;
    result.message = stop_reason + "; stopped the workers";
    return result;
  }
  errors.drain();  // what the workers wrote last (a child of theirs may still hold a pipe)
  if (failures.empty()) {
    errors.print_held();
    return result;
  }
  // The cause: a worker killed by a signal (it could not say why), else the first to report an
  // error of its own (not a connection broken by a peer's exit), else the first to fail.
  std::stable_sort(failures.begin(), failures.end(), [&](int a, int b) {
    return WIFSIGNALED(statuses[a]) && !WIFSIGNALED(statuses[b]);
  });
  int cause = failures.front();
  const WorkerErrors::Line* said = nullptr;  // the cause's own error line
  if (!WIFSIGNALED(statuses[cause])) {
    for (const auto& line : errors.held()) {
      if (!said && line.rank == cause) said = &line;
      if (!line.consequence) {
        said = &line;
        break;
      }
    }
    if (said) cause = said->rank;
  }
  const bool exited = std::find(failures.begin(), failures.end(), cause) != failures.end();
  result.message = "worker rank " + std::to_string(first + cause) + " " +
                   (exited ? describe_status(statuses[cause]) : std::string("failed")) +
                   (said ? ": " + said->text : std::string());
  for (const int rank : failures) {
    if (rank != cause)
      result.message +=
          "; rank " + std::to_string(first + rank) + " " + describe_status(statuses[rank]);
  }
  result.message += "; stopped the other workers";
  // A user error found by a worker keeps its exit status 2.
  result.exit_code =
      exited && WIFEXITED(statuses[cause]) && WEXITSTATUS(statuses[cause]) == 2 ? 2 : 1;
  return result;
}

LaunchResult launch_with_restarts(
    LaunchOptions& options, int max_restarts,
    const std::function<bool(int restart, const LaunchResult& failed)>& before_restart) {
  LaunchResult result = launch_workers(options);
  for (int restart = 1; result.exit_code != 0 && result.exit_code != 2 && restart <= max_restarts;
       ++restart) {
    if (!before_restart(restart, result)) return LaunchResult{};
    options.restart_count = restart;
    result = launch_workers(options);
  }
  return result;
}

std::string failure_text(const LaunchResult& result, int max_restarts) {
  if (max_restarts == 0 || result.exit_code == 2) return result.message;
  return result.message + " (after " + std::to_string(max_restarts) +
         (max_restarts == 1 ? " restart)" : " restarts)");
}

}  // namespace pptrain
