#include "pptrain/generators/families/families.h"

#include <algorithm>
#include <utility>

#include "pptrain/generators/generators.h"

namespace pptrain {

// The registry's one list (declared in registry.h): every family's entries, in --help's order.
// It is here, beside the families, so that the registry's own file needs none of them.
const std::vector<ScheduleEntry>& schedule_registry() {
  static const std::vector<ScheduleEntry> entries = [] {
    std::vector<ScheduleEntry> all;
    for (auto family : {synchronous_family, bidirectional_family, round_robin_family,
                        pipedream_family, two_bw_family, pipemare_family, avgpipe_family,
                        wpipe_family, ampnet_family, weight_prediction_family}) {
      for (ScheduleEntry& entry : family()) all.push_back(std::move(entry));
    }
    return all;
  }();
  return entries;
}

ScheduleEntry async_1f1b(const std::string& name, const std::string& summary,
                         const WeightRule& rule) {
  const auto make = [name](const ScheduleOptions& o) {
    Schedule schedule = make_1f1b(o.ranks, o.microbatches);
    schedule.name = name;
    schedule.flushes = false;
    return schedule;
  };
  ScheduleEntry entry{name, 1, 1, 1, summary, make};
  entry.update = &rule;
  return entry;
}

int NewestWeightsRule::forward_version(const VersionRule& r, int i, int stage) const {
  const int first = i - i % r.prediction_group();
  return std::max(0, first - (r.stages - 1 - stage)) / r.period();
}

int NewestWeightsRule::backward_version(const VersionRule& r, int i, int /*stage*/) const {
  return (i - i % r.prediction_group()) / r.period();
}

}  // namespace pptrain
