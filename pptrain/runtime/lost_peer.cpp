#include "pptrain/runtime/lost_peer.h"

#include <cxxabi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pptrain {

// /proc/PID/stat is "pid (name) S ...", and the name may hold spaces and parentheses: the state
// follows the last ')'.
char process_state(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!stat || !std::getline(stat, text)) return 0;
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '?';
  return text[close + 2];
}

bool process_ended(int pid) {
  const char state = process_state(pid);
  return state == 0 || state == 'Z' || state == 'X';
}

namespace {

// The text of the exception in flight: its what()'s first line (c10::Error's carries a
// backtrace), or its type when it is no std::exception.
std::string exception_in_flight() {
  const std::exception_ptr current = std::current_exception();
  if (!current) return "std::terminate was called with no exception in flight";
  try {
    std::rethrow_exception(current);
  } catch (const std::exception& e) {
    const std::string text = e.what();
    return text.substr(0, text.find('\n'));
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    if (!type) return "an exception of unknown type";
    int status = 0;
    char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
    std::string text = std::string("an exception of type ") + (name ? name : type->name());
    std::free(name);
    return text;
  }
}

struct TerminateState {
  std::mutex mutex;
  int rank = 0;
  std::vector<PeerProcess> peers;
  std::string host;
};

TerminateState& terminate_state() {
  static auto* state = new TerminateState;  // never destroyed: terminate may come during exit
  return *state;
}

[[noreturn]] void on_terminate() {
  static std::atomic<bool> entered{false};
  if (entered.exchange(true)) {  // a second thread, or the handler itself, failed: just stop
    std::_Exit(1);
  }
  const std::string cause = exception_in_flight();
  TerminateState& state = terminate_state();
  int rank = 0;
  std::vector<PeerProcess> peers;
  std::string host;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    rank = state.rank;
    peers = state.peers;
    host = state.host;
  }
  // The connection closes as the peer's process exits, a moment before /proc shows it ended.
  std::vector<int> ended = ended_peers(peers, host);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (ended.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ended = ended_peers(peers, host);
  }
  std::fflush(stdout);
  std::fprintf(stderr, "pptrain: error: %s\n", terminate_line(rank, ended, cause).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace

std::vector<int> ended_peers(const std::vector<PeerProcess>& peers, const std::string& host) {
  std::vector<int> ended;
  for (const PeerProcess& peer : peers) {
    if (peer.host == host && peer.pid > 0 && peer.pid != ::getpid() && process_ended(peer.pid)) {
      ended.push_back(peer.rank);
    }
  }
  return ended;
}

std::string terminate_line(int rank, const std::vector<int>& ended, const std::string& cause) {
  const std::string self = "rank " + std::to_string(rank) + ": ";
  if (ended.empty()) {
    return self + "a communication thread failed (no peer's process was seen to end): " + cause;
  }
  std::string lost;
  for (const int r : ended) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
  return self + "lost rank" + (ended.size() > 1 ? "s " : " ") + lost +
         " (its process ended): the connection broke (the peer may have exited); a "
         "communication thread then failed: " +
         cause;
}

void stop_with_one_line_on_terminate(int rank, std::vector<PeerProcess> peers, std::string host) {
  TerminateState& state = terminate_state();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.rank = rank;
    state.peers = std::move(peers);
    state.host = std::move(host);
  }
  std::set_terminate(on_terminate);
}

}  // namespace pptrain
