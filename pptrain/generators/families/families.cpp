#include "pptrain/generators/families/families.h"

#include <algorithm>

#include "pptrain/generators/generators.h"

namespace pptrain {

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
