#include "pptrain/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace pptrain {
namespace {

LaunchOptions shell(int workers, const std::string& script) {
  LaunchOptions options;
  options.workers = workers;
  options.executable = "/bin/sh";
  options.args = {"-c", script};
  return options;
}

TEST(Launcher, WorkersGetTheTorchrunEnvironment) {
  const auto result = launch_workers(shell(
      3,
      "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" = \"$LOCAL_RANK\" && test \"$RANK\" -lt 3 && "
      "test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0 && "
      "test \"$OMP_NUM_THREADS\" = 1 || exit 5"));
  EXPECT_EQ(result.exit_code, 0) << result.message;
  EXPECT_EQ(result.message, "");
}

TEST(Launcher, AWorkerKilledBySignalStopsTheOthersAndIsNamed) {
  // Rank 1 aborts; the others would sleep far longer than the test's timeout (exec: the shell
  // becomes the sleep, so killing the worker leaves no grandchild holding ctest's pipe).
  const auto result =
      launch_workers(shell(3, "if [ \"$RANK\" = 1 ]; then kill -ABRT $$; fi; exec sleep 600"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.message.rfind("worker rank 1 was killed by signal 6", 0), 0u) << result.message;
}

TEST(Launcher, AFailedExitStatusIsNamed) {
  const auto result =
      launch_workers(shell(2, "if [ \"$RANK\" = 0 ]; then exit 3; fi; exec sleep 600"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.message.rfind("worker rank 0 exited with status 3", 0), 0u) << result.message;
}

// Rank 1 reports an error of its own; rank 0 then reports the connection it lost and exits
// first. The message names rank 1 first, with its own words, and rank 0 after it.
TEST(Launcher, AWorkersOwnErrorIsTheCauseNotThePeerThatLostIt) {
  char marker[] = "/tmp/pptrain_launcher_test_XXXXXX";
  const int fd = mkstemp(marker);
  ASSERT_GE(fd, 0);
  close(fd);
  std::remove(marker);
  const std::string m = marker;
  const auto result = launch_workers(shell(
      2, "if [ \"$RANK\" = 1 ]; then echo 'pptrain: error: rank 1: disk full' >&2; touch " + m +
             "; sleep 0.1; exit 1; fi; while [ ! -e " + m + " ]; do sleep 0.01; done; " +
             "echo 'pptrain: error: rank 0: receive from rank 1: the connection broke (the peer "
             "may have exited): x' >&2; exit 1"));
  std::remove(marker);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.message.rfind("worker rank 1 ", 0), 0u) << result.message;
  EXPECT_NE(result.message.find(": disk full; rank 0 exited with status 1"), std::string::npos)
      << result.message;
  EXPECT_EQ(result.message.find("connection broke"), std::string::npos) << result.message;
}

TEST(Launcher, AStoppedWorkerStopsTheRunAndIsNamed) {
  LaunchOptions options = shell(2, "if [ \"$RANK\" = 1 ]; then kill -STOP $$; fi; exec sleep 600");
  options.stopped_timeout = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  const auto result = launch_workers(options);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.message.rfind("worker rank 1 has been stopped", 0), 0u) << result.message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// LaunchOptions::stop_for: the reason it gives stops workers that would run on, and is the
// launch's failure (a node that asks to join, for an elastic run's agent).
TEST(Launcher, AReasonToStopStopsTheWorkersAndIsTheMessage) {
  LaunchOptions options = shell(2, "exec sleep 600");
  int asked = 0;
  options.stop_for = [&asked] { return ++asked < 3 ? std::string() : std::string("time to go"); };
  const auto start = std::chrono::steady_clock::now();
  const auto result = launch_workers(options);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.message, "time to go; stopped the workers");
  EXPECT_GE(asked, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// A worker that is this process forked (LaunchOptions::run_in_child): the same environment and
// arguments as an executed one, and what an exec would have reset: the launcher's handlers of
// SIGINT and SIGTERM (else SIGTERM would not stop it) and its close-on-exec descriptors (the
// other workers' pipes).
TEST(Launcher, ForkedWorkersStartAsExecutedOnesWould) {
  LaunchOptions options;
  options.workers = 3;
  options.args = {"train", "--pp", "3"};
  options.run_in_child = [](const std::vector<std::string>& args) {
    if (args != std::vector<std::string>{"train", "--pp", "3"}) return 4;
    const auto is = [](const char* name, const std::string& value) {
      const char* set = std::getenv(name);
      return set && value == set;
    };
    if (!is("WORLD_SIZE", "3") || !is("OMP_NUM_THREADS", "1") || !is("MASTER_ADDR", "127.0.0.1") ||
        std::getenv("RANK") == nullptr || !is("LOCAL_RANK", std::getenv("RANK")))
      return 5;
    for (const int sig : {SIGINT, SIGTERM}) {
      struct sigaction action {};
      sigaction(sig, nullptr, &action);
      if (action.sa_handler != SIG_DFL) return 6;
    }
    for (int fd = STDERR_FILENO + 1; fd < 1024; ++fd) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0 && (flags & FD_CLOEXEC) != 0) return 7;
    }
    return 0;
  };
  const auto result = launch_workers(options);
  EXPECT_EQ(result.exit_code, 0) << result.message;
}

// A forked worker's error line and exit status name it as an executed worker's do, and the
// others, waiting, stop on the launcher's SIGTERM.
TEST(Launcher, AForkedWorkersErrorIsNamed) {
  LaunchOptions options;
  options.workers = 2;
  options.kill_grace = std::chrono::seconds(600);  // SIGTERM alone must stop rank 0
  options.run_in_child = [](const std::vector<std::string>&) {
    if (std::string(std::getenv("RANK")) == "1") {
      std::fprintf(stderr, "pptrain: error: rank 1: disk full\n");
      return 2;
    }
    while (true) pause();
  };
  const auto result = launch_workers(options);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.message.rfind("worker rank 1 exited with status 2: disk full", 0), 0u)
      << result.message;
}

TEST(Launcher, FreePortIsAPort) {
  const int port = find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

// A port whose listener closed a connection first keeps it in TIME_WAIT for a minute. A store
// binds it again at once, as both listeners reuse addresses, so it is free: an elastic run's
// agent that served the rendezvous and closed its doorbell's connections serves the next
// meeting there (with none serving, every agent waited for the endpoint until its timeout).
TEST(Launcher, APortWithOnlyClosedConnectionsIsFree) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  const int yes = 1;  // as the doorbell and c10d's store listen
  ASSERT_EQ(::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes), 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), size), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size), 0);
  const int port = ntohs(address.sin_port);
  EXPECT_FALSE(port_is_free(port));  // listening

  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), size), 0);
  const int served = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(served, 0);
  ::close(listener);
  ::close(served);  // the listener's side closes first: its end waits in TIME_WAIT
  char byte = 0;
  EXPECT_EQ(::recv(client, &byte, 1, 0), 0);  // the client sees the close
  ::close(client);
  EXPECT_TRUE(port_is_free(port));
}

}  // namespace
}  // namespace pptrain
