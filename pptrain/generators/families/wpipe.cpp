// WPipe: two groups of stages interleaved on every rank (stage s on rank s mod P), a step after
// each mini-batch; the first half of the stages (group 1) as 2bw, W^(k-1) for step k, running
// the next step's forwards early (2 versions), the second half (group 2) on W^(k), fresh (1
// version); the groups step alternately. Its order is make_wpipe (generators/generators.h), which
// waits for the versions. docs/ASYNC.md.
#include <algorithm>

#include "pptrain/generators/families/families.h"
#include "pptrain/generators/generators.h"

namespace pptrain {
namespace {

class WPipeRule : public WeightRule {
 public:
  const char* name() const override { return "wpipe"; }
  int forward_version(const VersionRule& r, int i, int stage) const override {
    return in_first_group(r, stage) ? std::max(0, i / r.microbatches_per_step - 1)
                                    : i / r.microbatches_per_step;
  }
  int versions_kept(const VersionRule& r, int stage) const override {
    return in_first_group(r, stage) ? 2 : 1;
  }

 private:
  // The first group: the first half of the stages, S / 2 of them.
  static bool in_first_group(const VersionRule& r, int stage) { return stage < r.stages / 2; }
};

}  // namespace

std::vector<ScheduleEntry> wpipe_family() {
  static const WPipeRule rule;
  ScheduleEntry entry;
  entry.name = "wpipe";
  entry.default_chunks = entry.min_chunks = entry.max_chunks = 2;
  entry.summary =
      "WPipe (async): two groups of stages interleaved on every rank (stage s on rank s mod "
      "P); the first as 2bw (2 versions), running the next step's forwards early, the second "
      "on fresh weights (1 version); the groups step alternately";
  entry.make = [](const ScheduleOptions& o) {
    return make_wpipe(o.ranks, o.microbatches, o.period > 0 ? o.period : o.microbatches);
  };
  entry.update = &rule;
  return {entry};
}

}  // namespace pptrain
