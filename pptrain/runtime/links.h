// Which path the messages between two ranks take, decided in one place, and the table of the
// paths a run's pairs of ranks used, for its start line and its metrics.
//
// The rules (choose_link), from each rank's place (its host, its CUDA device if any, whether it
// may map shared memory):
//   two CPU ranks of one host, both allowing shared memory   shm    (rings in /dev/shm; a
//                                                                   message over 4 MiB and a
//                                                                   pair whose rings did not
//                                                                   map go through Gloo)
//   two CPU ranks otherwise                                  gloo   (TCP)
//   two ranks on distinct CUDA devices, NCCL available       nccl
//   two ranks on one CUDA device (NCCL refuses them), a      host-staged shm or host-staged
//   CUDA rank and a CPU rank, or no NCCL                     gloo: the tensor is copied to the
//                                                            host and crosses as a CPU one
//   a rank and itself (a one-rank world, threads of one      local
//   process)
// What a transport finally used may differ from the choice (rings that did not map): the table
// holds what each rank's transport reports (Transport::link_to), not the rule's prediction.
//
//   LinkTable links(world_size);
//   links.set(0, 1, LinkKind::kShm);
//   links.describe({{0, 1}})   // "links: shm between ranks 0-1"
//
// No LibTorch here: the unit tests and the planner's tools may use it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pptrain {

enum class LinkKind : int {
  kNone = 0,  // not known (or a rank and itself in a table)
  kLocal,
  kShm,
  kGloo,
  kNccl,
  kStagedShm,
  kStagedGloo,
};

// "local", "shm", "gloo", "nccl", "host-staged shm", "host-staged gloo"; "?" for kNone.
const char* link_name(LinkKind kind);
// Whether messages of this kind cross as CPU tensors copied off a CUDA device first.
bool host_staged(LinkKind kind);

// What a CPU path becomes for a rank on a CUDA device: shm -> host-staged shm, gloo -> host-staged
// gloo; the others as they are.
LinkKind staged(LinkKind kind);

// Where one rank runs, as the link rules need it.
struct RankPlace {
  std::string host;      // the host's identity (boot, namespaces): equal on ranks that share memory
  int cuda_device = -1;  // the rank's CUDA device on its host; -1: it computes on the CPU
  bool shared_memory = false;  // it allows shared memory (TransportOptions::shared_memory)
};

// The link between ranks of places `a` and `b` (two ranks), by the rules above.
LinkKind choose_link(const RankPlace& a, const RankPlace& b, bool nccl_available);

// Every pair's link, [from][to], as each rank's transport reported it (a rank fills its row).
class LinkTable {
 public:
  explicit LinkTable(int world_size = 1);
  int world_size() const { return world_size_; }
  LinkKind at(int from, int to) const { return kinds_.at(index(from, to)); }
  void set(int from, int to, LinkKind kind) { kinds_.at(index(from, to)) = kind; }
  // The table as integers, row after row (what a sum over the ranks combines: each rank sends
  // its row, zeros elsewhere), and back.
  std::vector<int64_t> codes() const;
  static LinkTable from_codes(int world_size, const std::vector<int64_t>& codes);

  // The pairs `pairs` (each {a, b}, a < b; ranks that exchange messages), grouped by their link:
  // "links: shm between ranks 0-1, 2-3; gloo between ranks 1-2". A pair whose two ends report
  // different links shows both ("shm/gloo"). Empty pairs: "links: none (one rank)".
  std::string describe(const std::vector<std::pair<int, int>>& pairs) const;
  // The link of a pair as describe() names it: "shm", or "shm/gloo" when the ends disagree.
  std::string pair_name(int a, int b) const;

 private:
  size_t index(int from, int to) const;
  int world_size_;
  std::vector<LinkKind> kinds_;
};

}  // namespace pptrain
