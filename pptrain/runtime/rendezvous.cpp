#include "pptrain/runtime/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// True when `host` names an address of this machine: a socket binds to it only then.
bool is_local_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* a = found; a && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    local = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return local;
}

// A socket listening on `port` of every address (IPv6 with IPv4 mapped, else IPv4), closed on
// exec and not blocking; -1 when it cannot be bound. Port 0: a free one.
int listen_on(int port) {
  const auto bound = [](int fd, const sockaddr* address, socklen_t size) {
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    return ::bind(fd, address, size) == 0 && ::listen(fd, 64) == 0;
  };
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    const int no = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_addr = in6addr_any;
    any.sin6_port = htons(static_cast<uint16_t>(port));
    if (bound(fd, reinterpret_cast<sockaddr*>(&any), sizeof any)) return fd;
    ::close(fd);
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = htons(static_cast<uint16_t>(port));
  if (bound(fd, reinterpret_cast<sockaddr*>(&any), sizeof any)) return fd;
  ::close(fd);
  return -1;
}

// The port a listening socket has.
int port_of(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) return 0;
  return ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

// A connection to host:port within `timeout`; -1 when refused, unreachable or too slow.
int connect_within(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int connected = -1;
  for (addrinfo* a = found; a && connected < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      connected = fd;
      break;
    }
    pollfd wait{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    if (errno == EINPROGRESS && ::poll(&wait, 1, static_cast<int>(timeout.count())) == 1 &&
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0) {
      connected = fd;
      break;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return connected;
}

// The line `fd` sends within `timeout` (without its newline); empty when none comes.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  const auto until = Clock::now() + timeout;
  for (char c = 0; line.size() < 256;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    pollfd wait{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&wait, 1, static_cast<int>(left.count())) != 1) return {};
    if (::recv(fd, &c, 1, 0) != 1) return {};
    if (c == '\n') return line;
    line += c;
  }
  return {};
}

void send_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
}

// This agent's presence (see rendezvous.h): a socket that listens while the process lives. The
// kernel completes a probe's connection without us; the queue is emptied at each meeting.
int presence_fd() {
  static const int fd = listen_on(0);
  return fd;
}

// Empties a listening socket's queue of connections.
void drain(int fd) {
  for (int conn; fd >= 0 && (conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;)
    ::close(conn);
}

// The doorbell (see rendezvous.h): -1 when this agent keeps none.
struct Doorbell {
  int fd = -1;
  std::string run_id;
  std::vector<NodeMember> ringers;  // the nodes that asked to join since the last meeting
};
Doorbell& doorbell() {
  static Doorbell bell;
  return bell;
}

constexpr const char* kBellBanner = "pptrain-doorbell ";
constexpr const char* kBellRequest = "join ";

void close_doorbell() {
  Doorbell& bell = doorbell();
  if (bell.fd >= 0) ::close(bell.fd);
  bell.fd = -1;
}

std::string local_host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

// A node as the store and the doorbell carry it: "ADDRESS NPROC PRESENCE_PORT HOST".
std::string member_text(const NodeMember& member) {
  return member.address + " " + std::to_string(member.nproc) + " " +
         std::to_string(member.presence_port) + " " + member.host;
}

NodeMember parse_member(const std::string& text) {
  NodeMember member;
  std::istringstream in(text);
  in >> member.address >> member.nproc >> member.presence_port >> member.host;
  return member;
}

// True when the agent of `member` still lives: its presence takes a connection.
bool answers(const NodeMember& member) {
  const int fd =
      connect_within(member.address, member.presence_port, std::chrono::milliseconds(500));
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// A node that comes while the run trains finds the doorbell at the endpoint, not the store (a
// store says nothing first): it asks to join, twice a second, until it finds the store (the
// meeting its ring called) or the deadline passes.
void ring_if_running(const NodeGroup& group, const NodeMember& me, Clock::time_point deadline) {
  bool told = false;
  while (Clock::now() < deadline) {
    const int fd =
        connect_within(group.endpoint_host, group.endpoint_port, std::chrono::milliseconds(1000));
    if (fd < 0) return;
    const bool bell = read_line(fd, std::chrono::milliseconds(300)) == kBellBanner + group.run_id;
    if (bell) send_line(fd, kBellRequest + group.run_id + " " + member_text(me));
    ::close(fd);
    if (!bell) return;
    if (!told) {
      std::fprintf(stderr, "pptrain: run '%s' is training at %s:%d: asked to join it\n",
                   group.run_id.c_str(), group.endpoint_host.c_str(), group.endpoint_port);
      std::fflush(stderr);
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// True for an address of the loopback network (127.0.0.0/8, ::1), which only this host reaches.
bool is_loopback(const std::string& address) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, address.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::vector<uint8_t> bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

std::string text(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

// The agents' store at the endpoint: served here when the endpoint is this host's and its port
// is free, else a client of the agent that serves it (connecting until `timeout`).
c10::intrusive_ptr<c10d::TCPStore> open_store(const NodeGroup& group, bool* serving,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(group.endpoint_port);
  options.timeout = timeout;
  options.waitWorkers = false;
  *serving = false;
  // (A port taken already needs no attempt, which c10d would report on stderr.)
  if (is_local_host(group.endpoint_host) && port_is_free(group.endpoint_port)) {
    options.isServer = true;
    try {
      *serving = true;
      return c10::make_intrusive<c10d::TCPStore>(group.endpoint_host, options);
    } catch (const std::exception&) {
      *serving = false;  // another agent of this host serves it
    }
    options.isServer = false;
  }
  return c10::make_intrusive<c10d::TCPStore>(group.endpoint_host, options);
}

std::string where(const NodeGroup& group) {
  return group.endpoint_host + ":" + std::to_string(group.endpoint_port);
}

// The first line of a c10d error.
std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

}  // namespace

NodeAssignment static_assignment(const NodeGroup& group, int nproc) {
  PPTRAIN_ASSERT(!group.dynamic && nproc >= 1);
  NodeAssignment node;
  node.node_rank = group.node_rank;
  node.nnodes = group.max_nodes;
  node.first_rank = group.node_rank * nproc;
  node.world_size = group.max_nodes * nproc;
  node.master_addr = group.master_addr;
  node.master_port = group.master_port;
  node.run_id = group.run_id;
  return node;
}

namespace {

// The store's round: the highest any agent meeting there asked for (kRoundKey; 0 before any).
constexpr const char* kRoundKey = "round";

int store_round(c10d::TCPStore& store, const std::string& base) {
  return store.check({base + kRoundKey}) ? std::stoi(text(store.get(base + kRoundKey))) : 0;
}

// Raises the store's round to at least `round`; the round it holds then.
int raise_round(c10d::TCPStore& store, const std::string& base, int round) {
  for (;;) {
    const bool set = store.check({base + kRoundKey});
    const std::string now = set ? text(store.get(base + kRoundKey)) : std::string();
    if (set && std::stoi(now) >= round) return std::stoi(now);
    const std::string want = std::to_string(round);
    // compareSet sets the key when it holds `now` (or, unset, when `now` is empty).
    if (text(store.compareSet(base + kRoundKey, bytes(now), bytes(want))) == want) return round;
  }
}

}  // namespace

namespace {

// Who the closing agent waits for beyond MIN: the nodes of the meeting before and the nodes
// that rang for this one, each until it comes or its agent is found gone.
class Expected {
 public:
  Expected(const NodeAssignment* last, c10d::TCPStore& store, const std::string& prefix)
      : store_(store), prefix_(prefix) {
    if (!last) return;
    for (size_t i = 0; i < last->members.size(); ++i) {
      nodes_.push_back({last->members[i], "node " + std::to_string(i)});
    }
  }

  // True when every node waited for has come (among the first `count`) or is gone.
  bool settled(int count) {
    for (; arrived_.size() < static_cast<size_t>(count);) {
      arrived_.push_back(
          parse_member(text(store_.get(prefix_ + "node/" + std::to_string(arrived_.size())))));
    }
    const int rang = static_cast<int>(store_.add(prefix_ + "rang", 0));
    for (; read_rang_ < rang; ++read_rang_) {
      const std::string key = prefix_ + "rang/" + std::to_string(read_rang_);
      nodes_.push_back({parse_member(text(store_.get(key))), "a node that asked to join"});
    }
    if (nodes_.empty()) return false;  // the first meeting: MAX, or the last call
    bool settled = true;
    const auto now = Clock::now();
    for (Node& node : nodes_) {
      if (node.gone || std::count(arrived_.begin(), arrived_.end(), node.member)) continue;
      // Tried twice a second: an agent that lives comes, one that is gone is named.
      if (now >= node.next_try && !answers(node.member)) {
        node.gone = true;
        lost_.push_back(node.name + " (host " + node.member.host + ", " + node.member.address +
                        ")");
        continue;
      }
      if (now >= node.next_try) node.next_try = now + std::chrono::milliseconds(500);
      settled = false;
    }
    return settled;
  }

  // The nodes found gone, one line each (NodeAssignment::lost).
  const std::vector<std::string>& lost() const { return lost_; }

 private:
  struct Node {
    NodeMember member;
    std::string name;
    bool gone = false;
    Clock::time_point next_try{};
  };
  c10d::TCPStore& store_;
  std::string prefix_;
  std::vector<Node> nodes_;
  std::vector<NodeMember> arrived_;
  int read_rang_ = 0;
  std::vector<std::string> lost_;
};

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += (out.empty() ? "" : "\n") + line;
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

NodeAssignment c10d_rendezvous(const NodeGroup& group, int nproc, int round,
                               const NodeAssignment* last) {
  PPTRAIN_ASSERT(group.dynamic && nproc >= 1);
  const std::string base = "pptrain/rdzv/" + group.run_id + "/";
  const auto began = Clock::now();
  const auto deadline = began + std::chrono::seconds(group.join_timeout_s);
  // The endpoint's port is the store's again; the presence's queue of probes is emptied.
  close_doorbell();
  drain(presence_fd());
  const std::string address = local_address_towards(group.endpoint_host, group.endpoint_port);
  const NodeMember me{local_host_name(), address.empty() ? "127.0.0.1" : address,
                      port_of(presence_fd()), nproc};
  std::vector<NodeMember> ringers;
  std::swap(ringers, doorbell().ringers);
  // (A node that comes to an elastic run rings first; a node of the meeting before expects the
  // store, and rings only when it finds none, below.)
  if (!last && group.min_nodes < group.max_nodes) ring_if_running(group, me, deadline);
  bool serving = false;
  c10::intrusive_ptr<c10d::TCPStore> store;
  // A node of the meeting before may find the doorbell instead of the store: the others went on
  // without it while it could not be reached (a cut link, a frozen host) or its ranks were slow to
  // fail. So it tries the store for 2 s at a time (a doorbell fails its ping at once) and, between
  // tries, rings as a node that comes does, until the store answers or the join timeout is over:
  // a host that comes back finds the doorbell within a round of that.
  const bool may_ring = last && group.min_nodes < group.max_nodes;
  for (bool first = true;; first = false) {
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                 std::chrono::milliseconds(1000));
    try {
      if (may_ring && !first) ring_if_running(group, me, deadline);
      store = open_store(
          group, &serving,
          may_ring ? std::min<std::chrono::milliseconds>(left, std::chrono::seconds(2)) : left);
      break;
    } catch (const std::exception& e) {
      if (may_ring && Clock::now() + std::chrono::seconds(1) < deadline) continue;
      throw std::runtime_error("the rendezvous endpoint " + where(group) +
                               " did not answer within " + std::to_string(group.join_timeout_s) +
                               " s (--rdzv-conf join_timeout): " + first_line(e));
    }
  }
  NodeAssignment node;
  node.run_id = group.run_id;
  const auto timed_out = [&](int count) {
    return std::runtime_error(
        "the rendezvous of run '" + group.run_id + "' at " + where(group) + " has " +
        std::to_string(count) + " of at least " + std::to_string(group.min_nodes) +
        " nodes after " + std::to_string(group.join_timeout_s) +
        " s (--rdzv-conf join_timeout); are the other nodes started with the same "
        "--rdzv-endpoint and --rdzv-id?");
  };
  try {
    // The agents meet in the highest round any of them asks for: a node that comes late, asking
    // for its first, meets the others in the round of their next restart. An agent waiting in
    // a round that others have passed goes on to theirs.
    round = raise_round(*store, base, round);
    std::string prefix;
    int index = 0;
    for (bool met = false; !met;) {
      prefix = base + std::to_string(round) + "/";
      for (const NodeMember& ringer : ringers) {
        const int at = static_cast<int>(store->add(prefix + "rang", 1)) - 1;
        store->set(prefix + "rang/" + std::to_string(at), bytes(member_text(ringer)));
      }
      index = static_cast<int>(store->add(prefix + "arrived", 1)) - 1;
      store->set(prefix + "node/" + std::to_string(index), bytes(member_text(me)));
      if (index == 0) {
        // The first agent closes the round: at MAX nodes; at MIN once every node it waits for
        // came or is gone; else at MIN and a last call.
        Expected expected(last, *store, prefix);
        std::optional<Clock::time_point> min_reached;
        int count = 0;
        for (;;) {
          count = static_cast<int>(store->add(prefix + "arrived", 0));
          const auto now = Clock::now();
          if (count >= group.min_nodes && !min_reached) min_reached = now;
          if (count >= group.max_nodes ||
              (min_reached &&
               now - *min_reached >= std::chrono::seconds(group.last_call_timeout_s)))
            break;
          if (count >= group.min_nodes && expected.settled(count)) break;
          if (store_round(*store, base) > round) break;  // the others meet in a later round
          if (now >= deadline) throw timed_out(count);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (store_round(*store, base) > round) {
          round = store_round(*store, base);
          continue;
        }
        count = std::min(count, group.max_nodes);
        // The master is this host's address towards the endpoint, a loopback one when the
        // endpoint's name is this host's and resolves to the loopback here (Debian's "127.0.1.1
        // node1" in /etc/hosts): useless to the other hosts, whose ranks would wait at their
        // own 127.0.0.1. Then it is this host's address towards another host's agent.
        std::string master = me.address;
        for (int i = 1; i < count && is_loopback(master); ++i) {
          const NodeMember other =
              parse_member(text(store->get(prefix + "node/" + std::to_string(i))));
          const std::string towards =
              is_loopback(other.address)
                  ? ""
                  : local_address_towards(other.address, group.endpoint_port);
          if (!towards.empty()) master = towards;
        }
        store->set(prefix + "master", bytes(master + " " + std::to_string(find_free_port())));
        store->set(prefix + "lost", bytes(joined(expected.lost())));
        store->set(prefix + "closed", bytes(std::to_string(count)));
      }
      // Until the round closes, or the others go on to a later one.
      while (!store->check({prefix + "closed"})) {
        if (store_round(*store, base) > round) break;
        if (Clock::now() >= deadline)
          throw timed_out(static_cast<int>(store->add(prefix + "arrived", 0)));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      met = store->check({prefix + "closed"});
      if (!met) round = store_round(*store, base);
    }
    const int nodes = std::stoi(text(store->get(prefix + "closed")));
    if (index >= nodes) {
      throw std::runtime_error(
          "the rendezvous of run '" + group.run_id + "' at " + where(group) + " closed with " +
          std::to_string(nodes) + " nodes before this one came (--nnodes " +
          std::to_string(group.min_nodes) + ":" + std::to_string(group.max_nodes) + ")");
    }
    node.round = round;
    node.node_rank = index;
    node.nnodes = nodes;
    node.world_size = 0;
    for (int i = 0; i < nodes; ++i) {
      node.members.push_back(parse_member(text(store->get(prefix + "node/" + std::to_string(i)))));
      if (i < index) node.first_rank += node.members.back().nproc;
      node.world_size += node.members.back().nproc;
    }
    node.world_size = std::max(node.world_size, 1);
    node.lost = split_lines(text(store->get(prefix + "lost")));
    std::istringstream master(text(store->get(prefix + "master")));
    master >> node.master_addr >> node.master_port;
    // The agent that serves the store waits until every agent has read it.
    store->add(prefix + "read", 1);
    while (serving && store->add(prefix + "read", 0) < nodes) {
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const UserError&) {
    throw;
  } catch (const std::runtime_error& e) {
    const std::string what = first_line(e);
    if (what.rfind("the rendezvous", 0) == 0) throw;
    throw std::runtime_error(
        "the rendezvous at " + where(group) + " failed after " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - began).count()) +
        " s: " + what);
  }
  // An elastic run with room for more keeps a doorbell where the store was, while it trains.
  store.reset();
  if (serving && group.min_nodes < group.max_nodes && node.nnodes < group.max_nodes) {
    doorbell().fd = listen_on(group.endpoint_port);
    doorbell().run_id = group.run_id;
  }
  return node;
}

bool node_asks_to_join() {
  drain(presence_fd());
  Doorbell& bell = doorbell();
  if (bell.fd < 0) return false;
  const int conn = ::accept4(bell.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0) return false;
  send_line(conn, kBellBanner + bell.run_id);
  const std::string request = read_line(conn, std::chrono::seconds(1));
  ::close(conn);
  const std::string expect = kBellRequest + bell.run_id + " ";
  if (request.rfind(expect, 0) != 0) return false;
  const NodeMember ringer = parse_member(request.substr(expect.size()));
  if (ringer.address.empty() || ringer.nproc < 1) return false;
  bell.ringers.push_back(ringer);
  return true;
}

std::string describe_node(const NodeAssignment& node, int nproc) {
  const int last = node.first_rank + nproc - 1;
  return "node " + std::to_string(node.node_rank) + " of " + std::to_string(node.nnodes) +
         " (rank" + (nproc > 1 ? "s " + std::to_string(node.first_rank) + "-" : " ") +
         std::to_string(last) + " of " + std::to_string(node.world_size) + "), master " +
         node.master_addr + ":" + std::to_string(node.master_port) +
         (node.run_id != "none" ? ", run " + node.run_id : "");
}

}  // namespace pptrain
