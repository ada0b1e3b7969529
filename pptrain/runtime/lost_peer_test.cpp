#include "pptrain/runtime/lost_peer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace pptrain {
namespace {

// A child process that has exited and is not reaped yet (a zombie): a peer whose process ended.
// Reaped by the destructor.
class EndedProcess {
 public:
  EndedProcess() {
    pid_ = ::fork();
    if (pid_ == 0) ::_exit(0);
    siginfo_t info{};
    ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT);  // exited, not reaped
  }
  ~EndedProcess() { ::waitpid(pid_, nullptr, 0); }
  EndedProcess(const EndedProcess&) = delete;
  EndedProcess& operator=(const EndedProcess&) = delete;
  int pid() const { return static_cast<int>(pid_); }

 private:
  pid_t pid_ = -1;
};

// How a child process ended (its wait status) and what it wrote on stderr, when it ran `body`.
struct Ended {
  int status = 0;
  std::string err;
};
template <typename Body>
Ended run_in_child(Body body) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    body();
    ::_exit(3);
  }
  ::close(pipe_fds[1]);
  Ended ended;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    ended.err.append(buffer, n);
  ::close(pipe_fds[0]);
  ::waitpid(child, &ended.status, 0);
  return ended;
}

// What a library's thread does when a peer's connection breaks under it (the fault this file is
// for): throws where nothing of ours can catch.
void throw_on_a_thread_of_its_own() {
  std::thread([] { throw std::bad_alloc(); }).join();
}

TEST(LostPeer, EndedPeersAreTheZombiesAndTheGoneOfThisHostOnly) {
  EndedProcess ended;
  const std::string host = "this-host";
  const std::vector<PeerProcess> peers = {
      {0, host, ended.pid()},                    // exited, not reaped
      {1, host, static_cast<int>(::getppid())},  // alive
      {2, "another-host", ended.pid()},          // not ours to look at
      {3, host, static_cast<int>(::getpid())},   // this process
  };
  EXPECT_EQ(ended_peers(peers, host), std::vector<int>{0});
}

// A zombie still answers kill(pid, 0): the shared-memory receive asks process_ended(), which
// reads its state, so a peer that exited is named at once even before its parent reaps it.
TEST(LostPeer, AZombieHasEndedThoughKillStillFindsIt) {
  EndedProcess ended;
  EXPECT_EQ(::kill(ended.pid(), 0), 0);
  EXPECT_EQ(process_state(ended.pid()), 'Z');
  EXPECT_TRUE(process_ended(ended.pid()));
  EXPECT_FALSE(process_ended(static_cast<int>(::getpid())));
  EXPECT_NE(process_state(static_cast<int>(::getpid())), 0);
}

TEST(LostPeer, TheLineNamesTheLostRanksAndSaysTheConnectionBroke) {
  EXPECT_EQ(terminate_line(1, {0}, "std::bad_alloc"),
            "rank 1: lost rank 0 (its process ended): the connection broke (the peer may have "
            "exited); a communication thread then failed: std::bad_alloc");
  EXPECT_EQ(terminate_line(2, {0, 3}, "x").rfind("rank 2: lost ranks 0, 3 (its process ended)", 0),
            0u);
  EXPECT_EQ(terminate_line(1, {}, "std::bad_alloc"),
            "rank 1: a communication thread failed (no peer's process was seen to end): "
            "std::bad_alloc");
}

// Without the handler, an exception on a library's thread aborts the rank (the fault); with it,
// the rank stops with one line naming the peer whose process ended, and status 1.
TEST(LostPeer, AnExceptionOnAThreadOfItsOwnStopsTheRankWithOneLine) {
  // The C++ runtime's own handler, as a process starts with: a test before this one in the same
  // process may have installed ours.
  const Ended before = run_in_child([] {
    std::set_terminate(__gnu_cxx::__verbose_terminate_handler);
    throw_on_a_thread_of_its_own();
  });
  ASSERT_TRUE(WIFSIGNALED(before.status)) << before.status;
  EXPECT_EQ(WTERMSIG(before.status), SIGABRT);
  EXPECT_NE(before.err.find("terminate called after throwing an instance of 'std::bad_alloc'"),
            std::string::npos)
      << before.err;

  const Ended after = run_in_child([] {
    EndedProcess peer;
    stop_with_one_line_on_terminate(1, {{0, "here", peer.pid()}}, "here");
    throw_on_a_thread_of_its_own();
  });
  ASSERT_TRUE(WIFEXITED(after.status)) << after.status << ": " << after.err;
  EXPECT_EQ(WEXITSTATUS(after.status), 1);
  EXPECT_EQ(after.err,
            "pptrain: error: rank 1: lost rank 0 (its process ended): the connection broke (the "
            "peer may have exited); a communication thread then failed: std::bad_alloc\n");
}

}  // namespace
}  // namespace pptrain
