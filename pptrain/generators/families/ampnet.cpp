// AMPNet: 1F1B without a flush, no stash (1 version), a step after every U backwards
// (--update-interval); forward and backward each on the newest weights at their time, as
// PipeMare's rule with U for M. docs/ASYNC.md.
#include "pptrain/generators/families/families.h"

namespace pptrain {
namespace {

class AmpNetRule : public OneVersionRule {
 public:
  const char* name() const override { return "ampnet"; }
  int period(const VersionRule& r) const override { return r.update_interval; }
};

}  // namespace

std::vector<ScheduleEntry> ampnet_family() {
  static const AmpNetRule rule;
  ScheduleEntry entry =
      async_1f1b("ampnet",
                 "AMPNet (async): 1F1B without flush, no stash (1 version), a step after every "
                 "--update-interval backwards; forward and backward each on the newest weights",
                 rule);
  entry.options = {{"--update-interval",
                    "ampnet: each stage steps its optimizer after every U backwards (default 1)",
                    FamilyOption::Kind::kInt, 1}};
  entry.configure_rule = [](const FamilyValues& given, VersionRule& r) {
    r.update_interval = family_int(given, "--update-interval", 1);
  };
  return {entry};
}

}  // namespace pptrain
