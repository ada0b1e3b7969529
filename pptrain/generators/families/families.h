// The schedule families: each file of this folder states one family whole, its registry entries
// (name, chunks, summary, how to make the schedule) and the weight rule its schedules train
// with. families.cpp lists the families in the order of --help (schedule_registry()); a new
// family is a file here and one line there.
//
//   for (ScheduleEntry& e : pipedream_family()) entries.push_back(std::move(e));
#pragma once

#include <string>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/schedule/weight_versions.h"

namespace pptrain {

// The synchronous generators (gpipe, 1f1b, interleaved, the zero-bubble ones, the V-shapes,
// dualpipev) and the bidirectional ones that replicate stages (chimera, gems).
std::vector<ScheduleEntry> synchronous_family();
std::vector<ScheduleEntry> bidirectional_family();
// PipeDream's round robin over unevenly replicated stages (1f1b-rr).
std::vector<ScheduleEntry> round_robin_family();
// The asynchronous families, one rule each (weight prediction: two).
std::vector<ScheduleEntry> pipedream_family();
std::vector<ScheduleEntry> two_bw_family();
std::vector<ScheduleEntry> pipemare_family();
std::vector<ScheduleEntry> avgpipe_family();
std::vector<ScheduleEntry> wpipe_family();
std::vector<ScheduleEntry> ampnet_family();
std::vector<ScheduleEntry> weight_prediction_family();

// A generator that takes no chunk count (it runs the one its entry allows).
template <Schedule (*Make)(int, int)>
Schedule without_chunks(const ScheduleOptions& o) {
  return Make(o.ranks, o.microbatches);
}

// An asynchronous schedule that runs 1F1B's order without a flush under `rule` (which the
// entry points at; a rule lives as long as the program).
ScheduleEntry async_1f1b(const std::string& name, const std::string& summary,
                         const WeightRule& rule);

// The rules without a stash: a forward and a backward each run on the newest weights at their
// time in the pipelined 1F1B order. Stage s runs S-1-s forwards ahead, so microbatch i's
// forward comes after the backwards of microbatches 0 .. i-(S-s)-1, its backward after those of
// 0 .. i-1, and a step follows every period()-th backward. A prediction group starts from the
// version of its first microbatch.
class NewestWeightsRule : public WeightRule {
 public:
  int forward_version(const VersionRule& r, int i, int stage) const override;
  int backward_version(const VersionRule& r, int i, int stage) const override;
  bool backward_reruns_forward() const override { return true; }
};

// Those of them that keep one version and no prediction: the forward and the backward of a
// microbatch are at most ceil((S-1-stage) / period()) steps apart, the stage's delay.
class OneVersionRule : public NewestWeightsRule {
 public:
  int delay(const VersionRule& r, int stage) const override {
    return (r.stages - 1 - stage + r.period() - 1) / r.period();
  }
  int versions_kept(const VersionRule& /*r*/, int /*stage*/) const override { return 1; }
};

}  // namespace pptrain
