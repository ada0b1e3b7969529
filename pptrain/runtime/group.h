// Transports made from another: one among some ranks of the world, made the one way that fits
// their number (the world itself for all of them, an in-process loopback for one, a c10d
// subgroup for the rest), and the world with its ranks placed otherwise (a process plays the
// pipeline rank the planner gave it, not its launch rank).
//
//   Group pair = make_group(world, {0, 2});   // on ranks 0 and 2 only, the same list on both
//   pair->allreduce_sum(grads).wait();
//   auto placed = placed_transport(std::move(world), {1, 0});   // rank 0 is process 1
//   auto view = placed_view(*processes, {1, 0});   // the same; `processes` stays its owner's
#pragma once

#include <memory>
#include <vector>

#include "pptrain/runtime/transport.h"

namespace pptrain {

// A transport among `members` of `world` (see Transport::subgroup): `world` itself when they are
// all its ranks (returned as a non-owning pointer in `view`), a one-rank loopback for one member,
// else world.subgroup(members). `owned` holds whatever was made, so `view` lives while it does.
struct Group {
  Transport* view = nullptr;
  std::unique_ptr<Transport> owned;
  Transport& operator*() const { return *view; }
  Transport* operator->() const { return view; }
};
Group make_group(Transport& world, const std::vector<int>& members);

// `inner` with its ranks permuted: rank r of the result is the process of rank process_of[r] of
// `inner` (a permutation of 0 .. world_size - 1). Everything the result says or takes is in its
// own ranks (rank(), peers, subgroup() members, whose subgroups are placed alike), so a caller
// that finds its peers by rank runs unchanged; collectives pass through. The identity returns
// `inner` itself.
std::unique_ptr<Transport> placed_transport(std::unique_ptr<Transport> inner,
                                            const std::vector<int>& process_of);
// The same over a transport its owner keeps (it must outlive the result), the identity included:
// a run that places its ranks anew as it goes (`train --replan auto`) keeps the processes' own.
std::unique_ptr<Transport> placed_view(Transport& inner, const std::vector<int>& process_of);

}  // namespace pptrain
