#include "pptrain/runtime/group.h"

#include <algorithm>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/runtime/loopback_transport.h"

namespace pptrain {

Group make_group(Transport& world, const std::vector<int>& members) {
  PPTRAIN_ASSERT(!members.empty() && std::is_sorted(members.begin(), members.end()) &&
                     std::adjacent_find(members.begin(), members.end()) == members.end() &&
                     members.front() >= 0 && members.back() < world.world_size() &&
                     std::count(members.begin(), members.end(), world.rank()) == 1,
                 "a group needs distinct ascending ranks of the world, this rank among them");
  Group group;
  if (static_cast<int>(members.size()) == world.world_size()) {
    group.view = &world;
  } else {
    group.owned = members.size() == 1 ? std::move(make_loopback_transports(1).front())
                                      : world.subgroup(members);
    group.view = group.owned.get();
  }
  return group;
}

}  // namespace pptrain
