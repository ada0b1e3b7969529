#include "pptrain/runtime/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
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
// is free, else a client of the agent that serves it (connecting until the timeout).
c10::intrusive_ptr<c10d::TCPStore> open_store(const NodeGroup& group, bool* serving) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(group.endpoint_port);
  options.timeout = std::chrono::seconds(group.join_timeout_s);
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

NodeAssignment c10d_rendezvous(const NodeGroup& group, int nproc, int round) {
  PPTRAIN_ASSERT(group.dynamic && nproc >= 1);
  const std::string base = "pptrain/rdzv/" + group.run_id + "/";
  const auto began = Clock::now();
  const auto deadline = began + std::chrono::seconds(group.join_timeout_s);
  bool serving = false;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = open_store(group, &serving);
  } catch (const std::exception& e) {
    throw std::runtime_error("the rendezvous endpoint " + where(group) + " did not answer within " +
                             std::to_string(group.join_timeout_s) +
                             " s (--rdzv-conf join_timeout): " + first_line(e));
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
    const std::string address = local_address_towards(group.endpoint_host, group.endpoint_port);
    for (bool met = false; !met;) {
      prefix = base + std::to_string(round) + "/";
      index = static_cast<int>(store->add(prefix + "arrived", 1)) - 1;
      store->set(prefix + "node/" + std::to_string(index),
                 bytes((address.empty() ? "127.0.0.1" : address) + " " + std::to_string(nproc)));
      if (index == 0) {
        // The first agent closes the round: at MAX nodes, or MIN and a last call.
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
        std::string master = address.empty() ? "127.0.0.1" : address;
        for (int i = 1; i < count && is_loopback(master); ++i) {
          std::istringstream entry(text(store->get(prefix + "node/" + std::to_string(i))));
          std::string host;
          entry >> host;
          const std::string towards =
              is_loopback(host) ? "" : local_address_towards(host, group.endpoint_port);
          if (!towards.empty()) master = towards;
        }
        store->set(prefix + "master", bytes(master + " " + std::to_string(find_free_port())));
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
      std::istringstream entry(text(store->get(prefix + "node/" + std::to_string(i))));
      std::string host;
      int ranks = 0;
      entry >> host >> ranks;
      if (i < index) node.first_rank += ranks;
      node.world_size += ranks;
    }
    node.world_size = std::max(node.world_size, 1);
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
  return node;
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
