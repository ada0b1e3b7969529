// The overhead probe runs and gives figures the profile can hold. No timing is asserted: the
// figures depend on the machine and its load.
#include "pptrain/runtime/overhead_probe.h"

#include <gtest/gtest.h>

#include <cmath>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

TEST(OverheadProbe, GivesPositiveFiniteFigures) {
  OverheadProbeOptions options;
  options.steps = 5;
  const OverheadProfile o = measure_overheads(options);
  for (const double ms : {o.action_ms, o.send_ms, o.recv_ms}) {
    EXPECT_TRUE(std::isfinite(ms)) << ms;
    EXPECT_GT(ms, 0);
  }
  EXPECT_TRUE(o.measured());
}

TEST(OverheadProbe, RefusesNoSteps) {
  OverheadProbeOptions options;
  options.steps = 0;
  EXPECT_THROW(measure_overheads(options), UserError);
}

}  // namespace
}  // namespace pptrain
