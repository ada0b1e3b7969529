// The round-robin family: PipeDream's 1F1B-RR, stages replicated unevenly (the replica counts of
// a `pptrain partition --method pipedream` plan, or --replicas), microbatch i on replica
// i mod r_s of stage s, each replica running its own microbatches in 1F1B order
// (generators/generators.h: make_1f1b_rr). The replicas of a stage sum their gradients after the
// flush (schedule/reductions.h); synchronous. Without replica counts every stage has one, and
// it is 1F1B's order with a placement.
#include <algorithm>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/generators/families/families.h"
#include "pptrain/generators/generators.h"

namespace pptrain {
namespace {

Schedule round_robin(const ScheduleOptions& o) {
  const std::vector<int> replicas =
      o.replicas.empty() ? std::vector<int>(static_cast<size_t>(std::max(o.ranks, 0)), 1)
                         : o.replicas;
  long long ranks = 0;
  for (int r : replicas) ranks += r;
  PPTRAIN_CHECK(o.replicas.empty() || ranks == o.ranks, "schedule '1f1b-rr': its replicas ",
                "place the stages on ", ranks, " ranks, not ", o.ranks);
  check_generator_sizes("1f1b-rr", o.ranks, o.microbatches);
  Schedule s = make_1f1b_rr(replicas, o.microbatches);
  // One replica each places nothing: 1F1B's order on stage s's rank s, as its CSV reads back.
  if (std::all_of(replicas.begin(), replicas.end(), [](int r) { return r == 1; })) {
    s.placement.clear();
  }
  return s;
}

}  // namespace

std::vector<ScheduleEntry> round_robin_family() {
  ScheduleEntry entry{"1f1b-rr",
                      1,
                      1,
                      1,
                      "PipeDream's round robin (1F1B-RR): stage s on r_s replicas (--replicas, "
                      "or a pipedream partition's), microbatch i on replica i mod r_s, 1F1B on "
                      "each; one replica each: 1F1B",
                      round_robin};
  entry.takes_replicas = true;
  entry.planned = false;
  return {entry};
}

}  // namespace pptrain
