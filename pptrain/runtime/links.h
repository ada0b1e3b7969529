// The path the messages between two ranks took, and the table of the paths a run's pairs of
// ranks used, for its start line and its metrics. Each transport says what it used
// (Transport::link_to):
//   shm     two ranks of one host whose rings in /dev/shm mapped (both allowing shared memory);
//           a message over 4 MiB still goes through Gloo
//   gloo    Gloo's TCP: ranks of other hosts, a rank without shared memory, rings that did not map
//   nccl    a transport of the nccl backend
//   local   a rank and itself, or ranks that are threads of one process
// A rank on a CUDA device packs its messages into host memory and unpacks them there, so its CPU
// path becomes `host-staged shm` or `host-staged gloo` (staged()).
//
//   LinkTable links(world_size);
//   links.set(0, 1, LinkKind::kShm);
//   links.describe({{0, 1}})   // "links: shm between ranks 0-1"
//
// No LibTorch here.
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
// What a CPU path becomes for a rank on a CUDA device: shm -> host-staged shm, gloo -> host-staged
// gloo; the others as they are.
LinkKind staged(LinkKind kind);

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
