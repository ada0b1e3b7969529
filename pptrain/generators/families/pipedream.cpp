// PipeDream: 1F1B without a flush, an optimizer step after every microbatch, weight stashing so
// that a microbatch's backward runs on the weights its forward used (stage s keeps S-s
// versions); with its family option --vertical-sync every stage uses the version the microbatch
// entered the pipeline with (S versions). docs/ASYNC.md.
#include <algorithm>

#include "pptrain/generators/families/families.h"

namespace pptrain {
namespace {

// F and B of i at stage s use W_s^(max(0, i-(S-1-s))).
class PipeDreamRule : public WeightRule {
 public:
  const char* name() const override { return "pipedream"; }
  int period(const VersionRule& /*r*/) const override { return 1; }
  int forward_version(const VersionRule& r, int i, int stage) const override {
    return std::max(0, i - (r.stages - 1 - stage));
  }
  int versions_kept(const VersionRule& r, int stage) const override { return r.stages - stage; }
  bool ties_parameters() const override { return true; }
};

// Every stage uses W_s^(max(0, i-(S-1))).
class VerticalSyncRule : public WeightRule {
 public:
  const char* name() const override { return "vertical-sync"; }
  int period(const VersionRule& /*r*/) const override { return 1; }
  int forward_version(const VersionRule& r, int i, int /*stage*/) const override {
    return std::max(0, i - (r.stages - 1));
  }
  int versions_kept(const VersionRule& r, int /*stage*/) const override { return r.stages; }
};

}  // namespace

std::vector<ScheduleEntry> pipedream_family() {
  static const PipeDreamRule rule;
  static const VerticalSyncRule vertical_sync;
  ScheduleEntry entry =
      async_1f1b("pipedream",
                 "PipeDream (async): 1F1B without flush, an optimizer step after every "
                 "microbatch, weight stashing (stage s keeps P-s versions); --vertical-sync: P "
                 "versions everywhere",
                 rule);
  entry.options = {{"--vertical-sync",
                    "pipedream: every stage uses the weight version a microbatch entered with",
                    FamilyOption::Kind::kSwitch}};
  entry.other_rules = {&vertical_sync};
  entry.configure_rule = [](const FamilyValues& given, VersionRule& r) {
    if (family_switch(given, "--vertical-sync")) r.update = &vertical_sync;
  };
  return {entry};
}

}  // namespace pptrain
