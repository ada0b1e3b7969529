#include "pptrain/runtime/transport.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/cluster_env.h"
#include "pptrain/runtime/lost_peer.h"
#include "pptrain/runtime/rendezvous.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

namespace {

// The concrete groups (Gloo, NCCL) derive from c10d::Backend.
using GroupBase = c10d::Backend;

// The first line of an error's message: c10::Error's what() carries a C++ backtrace that a user
// of the command line does not need.
std::string brief(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

// When each peer's heartbeat (below) last moved, as this process's heartbeat saw it: when a
// communication times out, it names the peers that stopped answering (a collective of several
// ranks, or a peer on a host that became unreachable, says nothing of whom it waited for),
// whichever of the two timeouts fires first.
class SilentPeers {
 public:
  using Clock = std::chrono::steady_clock;

  // Never destroyed: a heartbeat thread may outlive main() (a transport that Python never
  // frees, or a thread its owner left to a stopped rank 0) and still write here at exit.
  static SilentPeers& instance() {
    static SilentPeers* const peers = new SilentPeers;
    return *peers;
  }

  // `moved[r]`: when rank r's counter last moved; Clock::time_point{} for this rank and the
  // ranks done. Empty: no heartbeat runs.
  void set(std::vector<Clock::time_point> moved) {
    std::lock_guard<std::mutex> lock(mutex_);
    moved_ = std::move(moved);
  }

  // "; rank 2 has not answered for 4 s (stopped, hung or unreachable)" for each peer silent for
  // 2.5 s or more (a live peer beats every second and is read every second: at most about 2 s
  // between two moves); empty when none is.
  std::string text() const {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    for (size_t rank = 0; rank < moved_.size(); ++rank) {
      if (moved_[rank] == Clock::time_point{} ||
          now - moved_[rank] < std::chrono::milliseconds(2500))
        continue;
      out += "; rank " + std::to_string(rank) + " has not answered for " +
             std::to_string(
                 std::chrono::duration_cast<std::chrono::seconds>(now - moved_[rank]).count()) +
             " s (stopped, hung or unreachable)";
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Clock::time_point> moved_;
};

// The failure `e` of a c10d operation (`what`: "receive from rank 1", "barrier", ...) as one
// line that says which of the two it was: no answer within `timeout` (naming the peers whose
// heartbeat went silent), or a connection that broke (its peer most likely exited, and said why).
std::runtime_error comm_failure(const std::string& what, std::chrono::milliseconds timeout,
                                const std::exception& e) {
  const std::string cause = brief(e);
  const bool timed_out = cause.find("imed out") != std::string::npos;
  return std::runtime_error(
      timed_out ? what + ": no answer within " + std::to_string(timeout.count() / 1000) +
                      " s (--comm-timeout, PPTRAIN_COMM_TIMEOUT_S): " + cause +
                      SilentPeers::instance().text()
                : what + ": the connection broke (the peer may have exited): " + cause);
}

// Starts a c10d operation: `start()` returns its Work. Gloo throws at once when the operation
// is posted on a connection that already broke (its peer exited while this rank computed), so
// that failure is worded as the waiter's would be, naming the operation and the peer.
template <typename Start>
c10::intrusive_ptr<c10d::Work> c10d_start(Start&& start, std::chrono::milliseconds timeout,
                                          const std::string& what) {
  try {
    return start();
  } catch (const std::exception& e) {
    throw comm_failure(what, timeout, e);
  }
}

// Waits on a c10d operation for at most `timeout`; its failure as comm_failure() words it.
PendingComm::Waiter c10d_waiter(c10::intrusive_ptr<c10d::Work> work,
                                std::chrono::milliseconds timeout, std::string what) {
  return [work = std::move(work), timeout, what = std::move(what)] {
    try {
      work->wait(timeout);
    } catch (const std::exception& e) {
      throw comm_failure(what, timeout, e);
    }
  };
}

// The store the ranks of a run meet in, at MASTER_ADDR:MASTER_PORT: served by rank 0 (`serve`),
// except under torchrun's agent (TORCHELASTIC_USE_AGENT_STORE=True), which serves it itself for
// every attempt of the group. There each attempt's keys live under a prefix of its own
// (TORCHELASTIC_RESTART_COUNT), as torch's own ranks keep them, so that ranks restarted in a world
// of the same size never read the addresses of the attempt before.
c10::intrusive_ptr<c10d::Store> open_run_store(const TransportOptions& options, bool serve,
                                               std::optional<int> workers) {
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent = agent_store && std::string(agent_store) == "True";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.master_port);
  store_options.isServer = serve && !agent;
  // `workers` ranks each count themselves in, and the server waits for them all; the agent's
  // store needs no count.
  if (workers && !agent) {
    store_options.numWorkers = *workers;
  } else {
    store_options.waitWorkers = false;
  }
  store_options.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
  if (!agent) return store;
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return c10::make_intrusive<c10d::PrefixStore>(
      "/pptrain/attempt_" + std::string(restarts ? restarts : "0"), store);
}

// The heartbeat of one rank of the world (see TransportOptions::heartbeat): a thread that adds
// 1 to its counter in the store every kInterval (1 s) and reads the others'. A peer whose
// counter has not moved for the communication timeout, and that has not said it is done, stops
// this process with one line naming it, whether or not this rank is waiting on it. The thread
// has its own connection to the store (rank 0 serves it), so it never shares a socket with the
// process group. A store call blocks while rank 0 is stopped, so on the other ranks a watchdog
// thread times the rounds and names rank 0 when the store has not answered for the timeout.
class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kInterval = std::chrono::seconds(1);

  explicit Heartbeat(const TransportOptions& options) : state_(std::make_shared<State>()) {
    state_->store = open_run_store(options, /*serve=*/false, std::nullopt);
    state_->rank = options.rank;
    state_->world_size = options.world_size;
    state_->timeout = options.timeout;
    state_->store_answered = std::chrono::steady_clock::now();
    thread_ = std::thread([state = state_] { run(*state); });
    // A store call waits as long as rank 0 does not answer: another thread times it.
    if (options.rank != 0) watchdog_ = std::thread([state = state_] { watch_store(*state); });
  }

  // Says this rank is done, so that no peer takes its silence for a hang, and stops the thread.
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stopping = true;
    }
    state_->wake.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // The thread may be inside a store call that waits for a stopped rank 0: give it two
    // intervals, then leave it (it owns its state, and the process is ending).
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (state_->wake.wait_for(lock, 2 * kInterval, [&] { return state_->stopped; })) {
      lock.unlock();
      thread_.join();
    } else {
      lock.unlock();
      thread_.detach();
    }
  }

  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  struct State {
    c10::intrusive_ptr<c10d::Store> store;
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{};
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;  // guarded by mutex
    bool stopped = false;   // guarded by mutex
    // When the store (rank 0) last answered a whole round, and whether its silence still means
    // something (not once rank 0 said it is done, or the store was found gone); guarded by mutex.
    std::chrono::steady_clock::time_point store_answered;
    bool store_watched = true;
  };

  static std::string beat_key(int rank) { return "pptrain/heartbeat/" + std::to_string(rank); }
  static std::string done_key(int rank) { return "pptrain/done/" + std::to_string(rank); }

  // Stops this process: `rank` has not answered for `silent`.
  [[noreturn]] static void lost(const State& state, int rank, std::chrono::milliseconds silent) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "pptrain: error: rank %d: rank %d has not answered for %lld s (stopped or hung)\n",
                 state.rank, rank, static_cast<long long>(silent.count() / 1000));
    std::fflush(stderr);
    std::_Exit(1);
  }

  static void run(State& state) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    std::vector<int64_t> seen(state.world_size, -1);  // each peer's counter when last read
    std::vector<Clock::time_point> moved(state.world_size, start);  // when it last changed
    std::vector<bool> done(state.world_size, false);
    std::vector<Clock::time_point> heard(state.world_size);  // SilentPeers': moved, not done
    bool stopping = false;
    while (!stopping) {
      try {
        state.store->add(beat_key(state.rank), 1);
        for (int peer = 0; peer < state.world_size; ++peer) {
          if (peer == state.rank || done[peer]) continue;
          if (state.store->check({done_key(peer)})) {
            done[peer] = true;
            heard[peer] = {};
            continue;
          }
          const int64_t count = state.store->add(beat_key(peer), 0);
          const auto now = Clock::now();
          if (count != seen[peer]) {
            seen[peer] = count;
            moved[peer] = now;
          } else if (now - moved[peer] >= state.timeout) {
            lost(state, peer,
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - moved[peer]));
          }
          heard[peer] = moved[peer];
        }
        SilentPeers::instance().set(heard);
      } catch (const std::exception&) {
        // The store is rank 0's, and it is gone: rank 0 has exited, and whoever waits on it
        // hears of that from the process group.
        break;
      }
      std::unique_lock<std::mutex> lock(state.mutex);
      state.store_answered = Clock::now();
      state.store_watched = !done[0];
      state.wake.wait_for(lock, kInterval, [&] { return state.stopping; });
      stopping = state.stopping;
    }
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.store_watched = false;
    }
    SilentPeers::instance().set({});
    try {
      state.store->add(done_key(state.rank), 1);
    } catch (const std::exception&) {
      // rank 0 and its store are gone: nobody is left to take our silence for a hang
    }
    std::lock_guard<std::mutex> lock(state.mutex);
    state.stopped = true;
    state.wake.notify_all();
  }

  // Stops this process when the store, rank 0's, has not answered a round for the timeout.
  static void watch_store(State& state) {
    std::unique_lock<std::mutex> lock(state.mutex);
    while (!state.stopping && state.store_watched) {
      const auto silent = std::chrono::steady_clock::now() - state.store_answered;
      if (silent >= state.timeout) {
        lock.unlock();
        lost(state, 0, std::chrono::duration_cast<std::chrono::milliseconds>(silent));
      }
      state.wake.wait_for(lock, kInterval, [&] { return state.stopping; });
    }
  }

  std::shared_ptr<State> state_;
  std::thread thread_;    // beats and reads the peers' counters
  std::thread watchdog_;  // times the store (not on rank 0, which serves it)
};

// ---- Messages between ranks of one host through shared memory ---------------------------------
//
// Gloo moves a point-to-point message over TCP through a thread of its own on each side: the
// receiver's loop thread reads the socket and wakes the thread waiting on the receive. On a
// small machine whose cores the ranks' compute keeps busy, those two wake-ups are most of what a
// small message costs (bench/executor_bench.cpp, docs/PERFORMANCE.md). Between two ranks of one
// host, SharedMemoryLinks instead writes each message into a ring in shared memory that the
// receiving thread itself polls while it waits: no thread in between, no system call on the way.
// Collectives, subgroups, independent transports and messages above kShmMaxMessageBytes stay on
// Gloo; both ends pick the path from the message's length, which they agree on (a receive's
// buffer is as long as its message).

// One direction between two ranks: a single-producer, single-consumer ring of records, each a
// 64-byte header (tag, length in bytes) and the bytes, padded to 64. A record that would cross
// the ring's end is preceded by a padding record (tag -1) to the end. `head` and `tail` count
// bytes written and consumed since the start, and a record at count c lies at (c - base) modulo
// the capacity; each counter lives in its own cache line.
//
// A record written to an empty ring goes to its front: the writer moves `base` to `head` first.
// The pages in use are then those of the most bytes ever in flight at once, not the whole
// ring's, which a writer going round would make resident one by one (and they stay in the
// cache). No padding is counted for it, so the ring keeps its whole room. The reader reads
// `base` after `head`, and `base` moves only while the reader has nothing left to read, so the
// two always place a record alike.
class ShmRing {
 public:
  static constexpr uint64_t kControlBytes = 4096;
  static constexpr uint64_t kRecordHeader = 64;

  // Maps the shared-memory object `fd` (of kControlBytes + capacity bytes); throws on failure.
  ShmRing(int fd, uint64_t capacity) : capacity_(capacity) {
    void* base =
        ::mmap(nullptr, kControlBytes + capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
    base_ = static_cast<uint8_t*>(base);
    control_ = reinterpret_cast<Control*>(base_);
    data_ = base_ + kControlBytes;
  }
  ~ShmRing() { ::munmap(base_, kControlBytes + capacity_); }
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // The sender: writes one record if the ring has room for it now.
  bool try_write(int64_t tag, const void* bytes, uint64_t length) {
    const uint64_t need = kRecordHeader + padded(length);
    const uint64_t head = control_->head.load(std::memory_order_relaxed);
    const uint64_t tail = control_->tail.load(std::memory_order_acquire);
    uint64_t base = control_->base.load(std::memory_order_relaxed);
    if (tail == head && (head - base) % capacity_ != 0) {
      base = head;  // published with `head` below
      control_->base.store(base, std::memory_order_relaxed);
    }
    uint64_t at = (head - base) % capacity_;
    const uint64_t to_end = capacity_ - at;
    const uint64_t padding = to_end < need ? to_end : 0;
    if (head + padding + need - tail > capacity_) {
      control_->writer_waits.store(1, std::memory_order_relaxed);
      return false;
    }
    if (control_->writer_waits.load(std::memory_order_relaxed) != 0) {
      control_->writer_waits.store(0, std::memory_order_relaxed);
    }
    if (padding > 0) {
      write_header(at, -1, padding - kRecordHeader);
      at = 0;
    }
    write_header(at, tag, length);
    if (length > 0) std::memcpy(data_ + at + kRecordHeader, bytes, length);
    control_->head.store(head + padding + need, std::memory_order_release);
    // The doorbell: a receiver asleep on it wakes now (a futex on the shared page).
    control_->writes.fetch_add(1, std::memory_order_seq_cst);
    if (control_->sleeping.load(std::memory_order_seq_cst) != 0) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&control_->writes), FUTEX_WAKE, 1, nullptr,
                nullptr, 0);
    }
    return true;
  }

  // The receiver: how many records were written so far (wrapping), and a sleep until that
  // changes from `seen`, for at most `at_most`. Sleeping lets the scheduler run others and wake
  // this thread first when the record comes, where polling would keep it runnable.
  uint32_t writes() const { return control_->writes.load(std::memory_order_seq_cst); }
  void sleep_until_written(uint32_t seen, std::chrono::microseconds at_most) {
    control_->sleeping.store(1, std::memory_order_seq_cst);
    if (control_->writes.load(std::memory_order_seq_cst) == seen) {
      timespec timeout{0, static_cast<long>(at_most.count()) * 1000};
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&control_->writes), FUTEX_WAIT, seen,
                &timeout, nullptr, 0);
    }
    control_->sleeping.store(0, std::memory_order_seq_cst);
  }

  // The receiver: hands every record written so far to take(tag, bytes, length), in order, and
  // frees its room after each; stops at the first record take() returns false for (not taken).
  template <typename Take>
  void drain(Take&& take) {
    uint64_t tail = control_->tail.load(std::memory_order_relaxed);
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    const uint64_t base = control_->base.load(std::memory_order_relaxed);  // after `head`
    while (tail < head) {
      const uint64_t at = (tail - base) % capacity_;
      int64_t words[2];
      std::memcpy(words, data_ + at, sizeof words);
      if (words[0] >= 0 &&
          !take(static_cast<int>(words[0]), data_ + at + kRecordHeader, words[1])) {
        return;  // left for a later drain, with everything behind it
      }
      tail += kRecordHeader + padded(static_cast<uint64_t>(words[1]));
      control_->tail.store(tail, std::memory_order_release);
    }
  }

  // The receiver: whether the writer found no room at its last try (it waits for the reader).
  bool writer_waits() const { return control_->writer_waits.load(std::memory_order_relaxed) != 0; }

  // The receiver: whether a record of `tag` waits in the ring, read or not.
  bool holds(int tag) const {
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    const uint64_t base = control_->base.load(std::memory_order_relaxed);
    for (uint64_t at_count = control_->tail.load(std::memory_order_relaxed); at_count < head;) {
      int64_t words[2];
      std::memcpy(words, data_ + (at_count - base) % capacity_, sizeof words);
      if (words[0] == tag) return true;
      at_count += kRecordHeader + padded(static_cast<uint64_t>(words[1]));
    }
    return false;
  }

  static uint64_t padded(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

 private:
  struct Control {
    alignas(64) std::atomic<uint64_t> head;
    std::atomic<uint64_t> base;          // the count at the ring's front (the writer's, as `head`)
    std::atomic<uint32_t> writer_waits;  // 1 while the writer's last try found no room
    alignas(64) std::atomic<uint64_t> tail;
    alignas(64) std::atomic<uint32_t> writes;  // records written, the futex a receiver sleeps on
    std::atomic<uint32_t> sleeping;            // 1 while the receiver sleeps on `writes`
  };
  static_assert(sizeof(std::atomic<uint32_t>) == 4, "a futex is 32 bits");
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring's counters are shared");

  void write_header(uint64_t at, int64_t tag, uint64_t length) {
    const int64_t words[2] = {tag, static_cast<int64_t>(length)};
    std::memcpy(data_ + at, words, sizeof words);
  }

  uint64_t capacity_;
  uint8_t* base_ = nullptr;
  Control* control_ = nullptr;
  uint8_t* data_ = nullptr;
};

// Per direction. A record takes at most half of it, so that one always fits, with the padding
// to the ring's end before it, once the ring has drained.
constexpr uint64_t kShmRingBytes = 8 << 20;
constexpr int64_t kShmMaxMessageBytes = kShmRingBytes / 2 - ShmRing::kRecordHeader;

// What two processes share when they see the same host, the same process ids and the same
// /dev/shm: host name, boot, and the pid and mount namespaces.
std::string host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string id = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  boot >> boot_id;
  id += "/" + boot_id;
  for (const char* ns : {"/proc/self/ns/pid", "/proc/self/ns/mnt"}) {
    char link[128] = {};
    const ssize_t n = ::readlink(ns, link, sizeof link - 1);
    id += "/" + (n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string("?"));
  }
  return id;
}

// A store's values as text and back.
std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}
std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// Whether PPTRAIN_SHM allows the shared-memory path ("1", "on" or unset; "0" or "off": Gloo
// alone). It is faster where actions are small (docs/PERFORMANCE.md, "Against the pair") and
// gives the same results bit for bit.
bool shared_memory_allowed() {
  const char* value = std::getenv("PPTRAIN_SHM");
  if (value == nullptr || *value == '\0') return true;
  const std::string text = value;
  PPTRAIN_CHECK(text == "1" || text == "on" || text == "0" || text == "off", "PPTRAIN_SHM='", text,
                "' is not 1, on, 0 or off");
  return text == "1" || text == "on";
}

// Whether /dev/shm has room for every ring `ranks` ranks of this host could fill (one per
// direction per pair). The rings are sparse files, taking pages as messages first reach them;
// a page tmpfs cannot give would stop the writer with SIGBUS, so a host that could run short
// keeps Gloo's TCP instead.
bool room_for_rings(int ranks) {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return false;
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t rings = static_cast<uint64_t>(ranks) * static_cast<uint64_t>(ranks - 1);
  return free_bytes >= rings * (ShmRing::kControlBytes + kShmRingBytes);
}

class SharedMemoryLinks {
 public:
  // Meets the other ranks in `store` (every rank calls it, at the same point): the peers that
  // share this host and both of whose rings mapped get a link; the others none. `enabled`
  // false: this rank takes part, but links to nobody.
  SharedMemoryLinks(c10d::Store& store, int rank, int world_size, bool enabled,
                    std::chrono::milliseconds timeout)
      : timeout_(timeout) {
    const std::string prefix = "pptrain/shm/";
    const std::string host = enabled ? host_identity() : "off/" + std::to_string(rank);
    store.set(prefix + "host/" + std::to_string(rank), bytes_of(host));
    store.set(prefix + "pid/" + std::to_string(rank), bytes_of(std::to_string(::getpid())));
    std::vector<int> local;
    for (int peer = 0; peer < world_size; ++peer) {
      if (peer != rank && text_of(store.get(prefix + "host/" + std::to_string(peer))) == host) {
        local.push_back(peer);
      }
    }
    const auto key = [&](const char* what, int from, int to) {
      return prefix + what + "/" + std::to_string(from) + "-" + std::to_string(to);
    };
    // Each rank makes the rings it receives on and names them; then maps the ones it sends on.
    std::map<int, std::string> made;
    const bool room = local.empty() || room_for_rings(static_cast<int>(local.size()) + 1);
    for (int peer : local) {
      std::string name = "/pptrain-" + std::to_string(::getpid()) + "-" +
                         std::to_string(std::random_device()()) + "-" + std::to_string(peer) + "-" +
                         std::to_string(rank);
      std::unique_ptr<ShmRing> ring = room ? open_ring(name, /*create=*/true) : nullptr;
      if (ring) {
        peers_[peer].in = std::move(ring);
        made[peer] = name;
      } else {
        name.clear();
      }
      store.set(key("ring", peer, rank), bytes_of(name));
    }
    for (int peer : local) {
      const std::string name = text_of(store.get(key("ring", rank, peer)));
      std::unique_ptr<ShmRing> ring = name.empty() ? nullptr : open_ring(name, /*create=*/false);
      store.set(key("mapped", rank, peer), bytes_of(ring ? "1" : "0"));
      if (ring) peers_[peer].out = std::move(ring);
    }
    for (int peer : local) {
      const bool theirs = text_of(store.get(key("mapped", peer, rank))) == "1";
      if (made.count(peer)) ::shm_unlink(made[peer].c_str());
      Peer& p = peers_[peer];
      if (!theirs || !p.in || !p.out) {
        peers_.erase(peer);
        continue;
      }
      p.pid = std::stoi(text_of(store.get(prefix + "pid/" + std::to_string(peer))));
    }
  }

  ~SharedMemoryLinks() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    if (writer_.joinable()) writer_.join();
  }
  SharedMemoryLinks(const SharedMemoryLinks&) = delete;
  SharedMemoryLinks& operator=(const SharedMemoryLinks&) = delete;

  // Whether `peer` has a link here (messages of up to kShmMaxMessageBytes).
  bool links(int peer) const { return peers_.count(peer) > 0; }
  // Whether a message of `bytes` to or from `peer` goes through shared memory.
  bool covers(int peer, int64_t bytes) const { return bytes <= kShmMaxMessageBytes && links(peer); }

  PendingComm send(const torch::Tensor& tensor, int peer, int tag, std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& p = peers_.at(peer);
    progress_locked();
    if (p.pending.empty() && p.out->try_write(tag, tensor.data_ptr(), tensor.nbytes())) {
      return PendingComm(nullptr, tensor);
    }
    // The ring is full: the writer thread writes it once the peer has read enough, as Gloo's
    // thread sends, so it never waits for this rank's next call (one that waits in a collective
    // meanwhile, or returns to a program that does, would wait for it forever).
    const uint64_t ticket = ++p.queued;
    p.pending.push_back({tag, tensor});
    if (!writer_.joinable()) writer_ = std::thread([this] { write_pending(); });
    queued_.notify_one();
    return PendingComm(
        [this, peer, ticket, what = std::move(what)] {
          wait_until([&] { return peers_.at(peer).written >= ticket; }, {peer, -1}, what);
        },
        tensor);
  }

  PendingComm recv(const torch::Tensor& buffer, int peer, int tag, std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& p = peers_.at(peer);
    auto posted = std::make_shared<Posted>();
    posted->buffer = buffer;
    auto early = p.arrived.find(tag);
    if (early != p.arrived.end() && !early->second.empty()) {
      fill(*posted, early->second.front().data_ptr(), early->second.front().numel());
      early->second.pop_front();
    } else {
      p.posted[tag].push_back(posted);
    }
    return PendingComm(
        [this, posted, peer, tag, what = std::move(what)] {
          wait_until([&] { return posted->done; }, {peer, tag}, what);
          if (!posted->error.empty()) throw std::runtime_error(what + ": " + posted->error);
        },
        buffer);
  }

 private:
  struct Outgoing {
    int tag;
    torch::Tensor tensor;
  };
  struct Posted {
    torch::Tensor buffer;
    bool done = false;
    std::string error;
  };
  struct Peer {
    std::unique_ptr<ShmRing> out, in;
    int pid = -1;
    std::deque<Outgoing> pending;  // sends the ring had no room for yet, in order
    uint64_t queued = 0;           // sends queued in `pending` so far
    uint64_t written = 0;          // of those, written into the ring
    std::unordered_map<int, std::deque<std::shared_ptr<Posted>>> posted;  // by tag, in order
    std::unordered_map<int, std::deque<torch::Tensor>> arrived;  // came before their receive
  };

  static std::unique_ptr<ShmRing> open_ring(const std::string& name, bool create) {
    const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) return nullptr;
    std::unique_ptr<ShmRing> ring;
    try {
      if (!create || ::ftruncate(fd, ShmRing::kControlBytes + kShmRingBytes) == 0) {
        ring = std::make_unique<ShmRing>(fd, kShmRingBytes);
      }
    } catch (const std::exception&) {
    }
    ::close(fd);
    if (!ring && create) ::shm_unlink(name.c_str());
    return ring;
  }

  static void fill(Posted& posted, const void* bytes, int64_t length) {
    posted.done = true;
    if (length != static_cast<int64_t>(posted.buffer.nbytes())) {
      posted.error = "a message of " + std::to_string(length) + " bytes for a receive of " +
                     std::to_string(posted.buffer.nbytes());
      return;
    }
    if (length > 0) std::memcpy(posted.buffer.data_ptr(), bytes, static_cast<size_t>(length));
  }

  // Writes what waits to be sent, as far as the rings have room, and takes what came in: into
  // the receives posted for it, stopping at the first message whose receive is not posted yet.
  // That one stays in the ring (as a Gloo message stays with its sender until its receive is
  // posted), so that no memory is taken for it before the memory model counts it. A rank waiting
  // for `awaited` (tag -1: a send, which waits for no message) copies aside, for their receives
  // to come, only the messages that hold it up: those in front of the awaited one, once it has
  // come, and all of a ring whose writer waits for room. The ring is searched for the awaited
  // message only when a message without its receive stands at its front.
  struct Awaited {
    int peer;
    int tag;
  };
  void progress_locked(const Awaited* awaited = nullptr) {
    for (auto& [peer, p] : peers_) {
      write_pending_locked(p);
      const bool full = awaited && p.in->writer_waits();
      std::optional<bool> in_front;  // of the awaited message; asked once, when it matters
      p.in->drain([&](int tag, const uint8_t* bytes, int64_t length) {
        auto posted = p.posted.find(tag);
        if (posted != p.posted.end() && !posted->second.empty()) {
          fill(*posted->second.front(), bytes, length);
          posted->second.pop_front();
          if (awaited && tag == awaited->tag) in_front = false;  // it has come: nothing more
          return true;
        }
        if (!full) {
          if (!in_front) {
            in_front =
                awaited && peer == awaited->peer && awaited->tag >= 0 && p.in->holds(awaited->tag);
          }
          if (!*in_front) return false;
        }
        torch::Tensor copy = torch::empty({length}, torch::kUInt8);
        if (length > 0) std::memcpy(copy.data_ptr(), bytes, static_cast<size_t>(length));
        p.arrived[tag].push_back(std::move(copy));
        return true;
      });
    }
  }

  // Writes what waits to be sent to `p`, as far as its ring has room.
  static void write_pending_locked(Peer& p) {
    while (!p.pending.empty()) {
      const Outgoing& next = p.pending.front();
      if (!p.out->try_write(next.tag, next.tensor.data_ptr(), next.tensor.nbytes())) break;
      p.pending.pop_front();
      ++p.written;
    }
  }

  // The writer thread: while sends wait for room, tries them every 100 us; else sleeps until
  // send() queues one, or the links close.
  void write_pending() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      bool waiting = false;
      for (auto& [peer, p] : peers_) {
        write_pending_locked(p);
        waiting = waiting || !p.pending.empty();
      }
      if (!waiting) {
        queued_.wait(lock);
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
    }
  }

  // Polls until `done()` holds, waiting for `awaited` (progress_locked()): spinning for 50 us (a
  // message between two busy ranks comes within microseconds), then asleep on the peer's ring until
  // it writes (naps of at most 1 ms, so that the other rings and what waits to be sent still move).
  // Throws after the timeout, or when `peer`'s process is gone, in the words of c10d_waiter().
  template <typename Done>
  void wait_until(Done&& done, Awaited awaited, const std::string& what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto checked = start;
    const int peer = awaited.peer;
    ShmRing& ring = *peers_.at(peer).in;
    while (true) {
      const uint32_t seen = ring.writes();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (done()) return;  // taken in already: no later message is copied aside for it
        progress_locked(&awaited);
        if (done()) return;
      }
      const auto now = Clock::now();
      if (now - start < std::chrono::microseconds(50)) continue;
      if (now - start >= timeout_) {
        throw std::runtime_error(what + ": no answer within " +
                                 std::to_string(timeout_.count() / 1000) +
                                 " s (--comm-timeout, PPTRAIN_COMM_TIMEOUT_S): timed out in "
                                 "shared memory" +
                                 SilentPeers::instance().text());
      }
      if (now - checked >= std::chrono::milliseconds(100)) {
        checked = now;
        // Ended, or a zombie its parent has not reaped yet (which kill(pid, 0) still finds):
        // under torchrun, whose agent may reap the ranks one after another.
        if (process_ended(peers_.at(peer).pid)) {
          throw std::runtime_error(what +
                                   ": the connection broke (the peer may have exited): its "
                                   "process ended");
        }
      }
      ring.sleep_until_written(seen, std::chrono::microseconds(1000));
    }
  }

  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::map<int, Peer> peers_;       // the peers on this host with a link, by rank
  std::condition_variable queued_;  // a send was queued, or the links close
  bool stopping_ = false;
  std::thread writer_;  // started at the first send a ring had no room for
};

class C10dTransport : public Transport {
 public:
  // `world_ranks`: the world rank of each of this group's ranks, for messages; empty: the world.
  C10dTransport(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<GroupBase> group,
                const TransportOptions& options, std::vector<int> world_ranks = {})
      : store_(std::move(store)),
        group_(std::move(group)),
        options_(options),
        world_ranks_(std::move(world_ranks)) {
    if (world_ranks_.empty()) {
      for (int r = 0; r < options_.world_size; ++r) world_ranks_.push_back(r);
    }
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  PendingComm send(const torch::Tensor& tensor, int peer, int tag) override {
    PPTRAIN_ASSERT(tensor.is_contiguous(), "send needs a contiguous tensor");
    if (shm_ && shm_->covers(peer, static_cast<int64_t>(tensor.nbytes()))) {
      return shm_->send(tensor, peer, tag, "send to rank " + std::to_string(world_ranks_.at(peer)));
    }
    std::vector<at::Tensor> tensors{tensor};
    std::string what = "send to rank " + std::to_string(world_ranks_.at(peer));
    auto work =
        c10d_start([&] { return group_->send(tensors, peer, tag); }, options_.timeout, what);
    return PendingComm(c10d_waiter(std::move(work), options_.timeout, std::move(what)), tensor);
  }

  PendingComm recv(const torch::Tensor& buffer, int peer, int tag) override {
    PPTRAIN_ASSERT(buffer.is_contiguous(), "recv needs a contiguous buffer");
    if (shm_ && shm_->covers(peer, static_cast<int64_t>(buffer.nbytes()))) {
      return shm_->recv(buffer, peer, tag,
                        "receive from rank " + std::to_string(world_ranks_.at(peer)));
    }
    std::vector<at::Tensor> tensors{buffer};
    std::string what = "receive from rank " + std::to_string(world_ranks_.at(peer));
    auto work =
        c10d_start([&] { return group_->recv(tensors, peer, tag); }, options_.timeout, what);
    return PendingComm(c10d_waiter(std::move(work), options_.timeout, std::move(what)), buffer);
  }

  PendingComm allreduce_sum_async(const torch::Tensor& tensor) override {
    PPTRAIN_ASSERT(tensor.is_contiguous(), "all-reduce needs a contiguous tensor");
    std::vector<at::Tensor> tensors{tensor};
    std::string what = "all-reduce with " + others();
    auto work = c10d_start([&] { return group_->allreduce(tensors); }, options_.timeout, what);
    return PendingComm(c10d_waiter(std::move(work), options_.timeout, std::move(what)), tensor);
  }

  void barrier() override {
    const std::string what = "barrier with " + others();
    c10d_waiter(c10d_start([&] { return group_->barrier(); }, options_.timeout, what),
                options_.timeout, what)();
  }

  std::unique_ptr<Transport> subgroup(const std::vector<int>& members) override;
  std::unique_ptr<Transport> independent(const std::string& name) override;
  LinkKind link_to(int peer) const override {
    if (peer == options_.rank) return LinkKind::kLocal;
    if (shm_ && shm_->links(peer)) return LinkKind::kShm;
    return options_.backend == "nccl" ? LinkKind::kNccl : LinkKind::kGloo;
  }

  // Once every rank has joined: from then on, each one's silence means something.
  void start_heartbeat() { heartbeat_ = std::make_unique<Heartbeat>(options_); }
  // The world's transport: messages to the ranks of this host through shared memory (when
  // TransportOptions::shared_memory), every rank taking part.
  void link_local_ranks() {
    shm_ = std::make_unique<SharedMemoryLinks>(*store_, options_.rank, options_.world_size,
                                               options_.shared_memory, options_.timeout);
  }

 private:
  // "rank 1" or "ranks 0, 2, 3": the other members (world ranks), which a collective waits for.
  std::string others() const {
    std::string text;
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      text += (text.empty() ? "" : ", ") + std::to_string(world_ranks_[r]);
    }
    return (options_.world_size > 2 ? "ranks " : "rank ") + text;
  }

  // How many groups called `name` this transport formed before this call, which counts it.
  int formed(const std::string& name) {
    std::lock_guard<std::mutex> lock(formed_mutex_);
    return formed_[name]++;
  }

  c10::intrusive_ptr<c10d::Store> store_;  // kept alive: rank 0 serves it to the others
  c10::intrusive_ptr<GroupBase> group_;
  TransportOptions options_;
  std::vector<int> world_ranks_;  // [group rank] -> world rank
  std::mutex formed_mutex_;
  std::map<std::string, int> formed_;       // groups formed by name: members or independent name
  std::unique_ptr<SharedMemoryLinks> shm_;  // the world's transport only; may link no peer
  // The world's transport only. Last, so destroyed first, while rank 0 still serves the store.
  std::unique_ptr<Heartbeat> heartbeat_;
};

int env_int(const char* name) {
  const char* text = std::getenv(name);
  PPTRAIN_CHECK(
      text && *text, "environment variable ", name,
      " is not set (expected as torchrun sets it: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  PPTRAIN_CHECK(*end == '\0' && value >= 0 && value < (1L << 30), "environment variable ", name,
                "='", text, "' is not a non-negative integer");
  return static_cast<int>(value);
}

}  // namespace

// The rank its launcher gave this process (runtime/cluster_env.h: torchrun's variables, srun's
// or mpirun's).
TransportOptions TransportOptions::from_env() {
  const ClusterEnv env = cluster_env_of_process();
  PPTRAIN_CHECK(env.launcher != Launcher::kNone,
                "environment variable RANK is not set (expected as torchrun sets it: RANK, "
                "WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or srun's, or mpirun's)");
  TransportOptions options;
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.master_addr = env.master_addr;
  options.master_port = env.master_port;
  if (const char* t = std::getenv("PPTRAIN_COMM_TIMEOUT_S"); t && *t) {
    options.timeout = std::chrono::seconds(env_int("PPTRAIN_COMM_TIMEOUT_S"));
  }
  options.shared_memory = shared_memory_allowed();
  return options;
}

// The local address this host reaches `master_addr` from (rendezvous.h), which is where the
// other ranks reach this one: a UDP socket "connected" to it (nothing is sent) is bound to the
// outgoing interface's address. On the master's host that is the master address itself; on another
// host it is that host's address on the shared network, not the master's (which it cannot bind).
std::string local_address_towards(const std::string& master_addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(master_addr.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return "";
  }
  std::string local;
  for (addrinfo* a = found; a && local.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage own{};
    socklen_t length = sizeof own;
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &length) == 0) {
      const void* address =
          own.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&own)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&own)->sin6_addr);
      if (::inet_ntop(own.ss_family, address, text, sizeof text)) local = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return local;
}

namespace {

// Gloo's device: on GLOO_SOCKET_IFNAME's interface when it is set (as torch does), else on the
// address this host reaches the master from.
std::shared_ptr<::gloo::transport::Device> gloo_device(const TransportOptions& options) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  const std::string local = local_address_towards(options.master_addr, options.master_port);
  return c10d::ProcessGroupGloo::createDeviceForHostname(local.empty() ? options.master_addr
                                                                       : local);
}

// The process group of `options.rank` among `options.world_size` ranks that meet in `store`.
c10::intrusive_ptr<GroupBase> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const TransportOptions& options) {
  c10::intrusive_ptr<GroupBase> group;
  if (options.backend == "gloo") {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(gloo_device(options));
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size,
                                                        gloo_options);
#if defined(USE_C10D_NCCL)
  } else if (options.backend == "nccl") {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank, options.world_size,
                                                        nccl_options);
#endif
  } else {
    PPTRAIN_CHECK(false, "communication backend '", options.backend,
                  "' is not available (expected gloo"
#if defined(USE_C10D_NCCL)
                  " or nccl"
#endif
                  ")");
  }
  return group;
}

// Every rank's host and process id, told through `store` (every rank calls it, at the same
// point): what lost_peer.h needs to name a peer whose process ended.
std::vector<PeerProcess> meet_processes(c10d::Store& store, const TransportOptions& options) {
  const std::string prefix = "pptrain/process/";
  store.set(prefix + std::to_string(options.rank),
            bytes_of(std::to_string(::getpid()) + " " + host_identity()));
  std::vector<PeerProcess> peers;
  for (int peer = 0; peer < options.world_size; ++peer) {
    if (peer == options.rank) continue;
    const std::string text = text_of(store.get(prefix + std::to_string(peer)));
    const size_t space = text.find(' ');
    if (space == std::string::npos) continue;
    peers.push_back({peer, text.substr(space + 1), std::atoi(text.substr(0, space).c_str())});
  }
  return peers;
}

std::unique_ptr<Transport> connect_or_throw(const TransportOptions& options) {
  c10::intrusive_ptr<c10d::Store> store =
      open_run_store(options, /*serve=*/options.rank == 0, options.world_size);
  auto transport =
      std::make_unique<C10dTransport>(store, make_process_group(store, options), options);
  if (options.world_size > 1) {
    transport->link_local_ranks();
    stop_with_one_line_on_terminate(options.rank, meet_processes(*store, options), host_identity());
  }
  if (options.heartbeat && options.world_size > 1) transport->start_heartbeat();
  return transport;
}

// A subgroup meets in the parent's store under a prefix naming its members and how many groups
// of those members this transport formed before (its members form them in the same order): groups
// with other members never mix their keys, and a group formed again (a second pipeline in the
// same processes) never reads the addresses its members had in the last one.
std::unique_ptr<Transport> C10dTransport::subgroup(const std::vector<int>& members) {
  std::string named;
  for (int m : members) named += "/" + std::to_string(m);
  const std::string prefix = "group" + named + "#" + std::to_string(formed(named));
  const auto position = std::find(members.begin(), members.end(), options_.rank);
  PPTRAIN_ASSERT(position != members.end(), "rank ", options_.rank, " is not in its group");
  TransportOptions options = options_;
  options.rank = static_cast<int>(position - members.begin());
  options.world_size = static_cast<int>(members.size());
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  try {
    std::vector<int> world_ranks;
    for (int m : members) world_ranks.push_back(world_ranks_.at(m));
    return std::make_unique<C10dTransport>(store, make_process_group(store, options), options,
                                           world_ranks);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(options_.rank) + ": the group " + named +
                             " did not form within " +
                             std::to_string(options.timeout.count() / 1000) + " s: " + brief(e));
  }
}

// An independent transport meets in the store under a prefix of its own name (and, as a
// subgroup, how many of that name this transport formed before), with this one's ranks.
std::unique_ptr<Transport> C10dTransport::independent(const std::string& name) {
  const std::string named = "independent/" + name;
  const std::string prefix = named + "#" + std::to_string(formed(named));
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  try {
    return std::make_unique<C10dTransport>(store, make_process_group(store, options_), options_,
                                           world_ranks_);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(options_.rank) + ": the transport '" + name +
                             "' did not form within " +
                             std::to_string(options_.timeout.count() / 1000) + " s: " + brief(e));
  }
}

}  // namespace

std::unique_ptr<Transport> connect_transport(const TransportOptions& options) {
  const auto began = std::chrono::steady_clock::now();
  // A write to a peer whose process has ended raises SIGPIPE, which by default ends this process
  // without a word (exit status 141; c10d's store writes without MSG_NOSIGNAL). Ignored, the
  // write fails with EPIPE instead, and the operation's error names the peer. A program's own
  // handler (or Python's, which ignores it already) is kept.
  struct sigaction pipe {};
  if (sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
  try {
    return connect_or_throw(options);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    // Most often a rank that never started, or ranks given different MASTER_ADDR/MASTER_PORT.
    // The store and then the process group each wait up to the timeout, so the message says
    // how long this rank really waited.
    const auto waited =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - began);
    throw std::runtime_error(
        "rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size) +
        " could not join the rendezvous at " + options.master_addr + ":" +
        std::to_string(options.master_port) + ": gave up after " + std::to_string(waited.count()) +
        " s (each of its stages waits up to " + std::to_string(options.timeout.count() / 1000) +
        " s, --comm-timeout; are all WORLD_SIZE ranks started with the same MASTER_ADDR and "
        "MASTER_PORT?): " +
        brief(e));
  }
}

int message_tag(const Action& comm, const Schedule& schedule) {
  const size_t count = message_count(schedule);
  PPTRAIN_CHECK(count <= static_cast<size_t>(kControlTagBase), "a schedule of ",
                schedule.num_stages, " stages and ", schedule.num_microbatches,
                " microbatches has ", count, " messages per step",
                schedule.skips.empty() ? "" : " (skip connections included)", ", more than the ",
                kControlTagBase, " tags below the control tags (use fewer stages or microbatches)");
  return static_cast<int>(message_index(comm, schedule));
}

}  // namespace pptrain
