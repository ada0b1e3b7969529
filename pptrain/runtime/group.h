// A transport among some ranks of the world, made the one way that fits their number: the world
// itself for all of them, an in-process loopback for one, a c10d subgroup for the rest.
//
//   Group pair = make_group(world, {0, 2});   // on ranks 0 and 2 only, the same list on both
//   pair->allreduce_sum(grads).wait();
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

}  // namespace pptrain
