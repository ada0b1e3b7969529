// Plans 1F1B on 4 ranks with 8 microbatches through the installed pptrain::plan; prints its bubble.
#include <cstdio>

#include "pptrain/generators/registry.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/simulator.h"

int main() {
  using namespace pptrain;
  const ValidatedSchedule schedule = validate(make_schedule({"1f1b", 4, 8}));
  const SimResult result = simulate(schedule, CostModel::parse("F=1,I=1,W=1"));
  std::printf("1f1b P=4 M=8: bubble ratio %.4f\n", result.bubble_ratio);
  return 0;
}
