#include "pptrain/sim/compare.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

TimelineEvent event(int rank, const std::string& action, double start, double end) {
  return TimelineEvent{rank, parse_action(action), start, end};
}

TEST(MeasureCosts, StepMeansThenMedianOverSteps) {
  // Two stages on two ranks, two microbatches. Step 1: 0F0 1 ms, 0F1 3 ms (mean 2 ms);
  // step 2: 4 ms and 4 ms (mean 4); step 3: 5 and 7 (mean 6) -> median 4 ms.
  std::vector<Timeline> steps;
  for (auto [a, b] : {std::pair{1.0, 3.0}, {4.0, 4.0}, {5.0, 7.0}}) {
    Timeline t;
    t.num_ranks = 2;
    t.events = {event(0, "0F0", 0, a * 1e-3), event(0, "0F1", 0.01, 0.01 + b * 1e-3),
                event(1, "1B0", 0.02, 0.025), event(0, "0I1", 0.03, 0.032),
                event(0, "0W1", 0.04, 0.041)};
    steps.push_back(t);
  }
  const MeasuredCosts m = measure_costs(steps, 2);
  ASSERT_EQ(m.cost.stage_forward.size(), 2u);
  EXPECT_NEAR(m.cost.stage_forward[0], 4e-3, 1e-12);
  EXPECT_EQ(m.cost.stage_forward[1], 0);  // never ran
  EXPECT_NEAR(m.cost.stage_backward[1], 5e-3, 1e-12);
  EXPECT_NEAR(m.cost.stage_backward_input[0], 2e-3, 1e-12);
  EXPECT_NEAR(m.cost.stage_backward_weight[0], 1e-3, 1e-12);
  EXPECT_EQ(m.comm_samples, 0);
  EXPECT_EQ(m.cost.comm, 0);
}

TEST(MeasureCosts, LatencyFromReceivesThatWaited) {
  Timeline t;
  t.num_ranks = 2;
  t.events = {// Rank 1 waits from 0 for microbatch 0, sent at 1.0, arrives 1.3: one sample of 0.3.
              event(0, "0SEND_F0", 1.0, 1.01), event(1, "1RECV_F0", 0.0, 1.3),
              // Microbatch 1 had arrived before rank 1 asked for it: no sample.
              event(0, "0SEND_F1", 2.0, 2.01), event(1, "1RECV_F1", 5.0, 5.0),
              // A gradient going back, waited for: 0.5.
              event(1, "1SEND_B0", 3.0, 3.0), event(0, "0RECV_B0", 2.5, 3.5)};
  const MeasuredCosts m = measure_costs({t}, 2);
  EXPECT_EQ(m.comm_samples, 2);
  EXPECT_NEAR(m.cost.comm, 0.395, 1e-12);  // RECV end - SEND end: median of 0.29 and 0.5
}

// The overheads are the gaps between a rank's events (compare.h), by hand:
//   rank 0: 0F0 [0, 1], 0SEND_F0 [1.1, 1.3], 0F1 [1.35, 2.35], 0SEND_F1 [2.45, 2.6],
//           0RECV_B0 [2.7, 5.0] (waited: 5.0 - 4.6 = 0.4), 0B0 [5.1, 7.1]
//   rank 1: 1RECV_F0 [0.2, 1.6] (waited: 1.6 - 1.3 = 0.3), 1F0 [1.7, 2.7],
//           1RECV_F1 [3.0, 3.2] (3.0 >= 2.6 + 0.35: arrived, takes 0.2), 1F1 [3.25, 3.75],
//           1B0 [3.85, 4.4], 1SEND_B0 [4.5, 4.6]
// action: the gaps after 0F0, 0F1, 1F1, 1B0 (0.1 each; 1F0's is before a RECV); send: 0SEND_F0's
// 0.2 + 0.05 (0SEND_F1's gap is before a RECV); recv: 1RECV_F1's 0.2 + 0.05; comm: the waited
// median 0.35 less the arrived receive's 0.2.
TEST(MeasureCosts, OverheadsFromTheGapsBetweenARanksEvents) {
  Timeline t;
  t.num_ranks = 2;
  t.events = {event(0, "0F0", 0, 1),          event(0, "0SEND_F0", 1.1, 1.3),
              event(0, "0F1", 1.35, 2.35),    event(0, "0SEND_F1", 2.45, 2.6),
              event(0, "0RECV_B0", 2.7, 5.0), event(0, "0B0", 5.1, 7.1),
              event(1, "1RECV_F0", 0.2, 1.6), event(1, "1F0", 1.7, 2.7),
              event(1, "1RECV_F1", 3.0, 3.2), event(1, "1F1", 3.25, 3.75),
              event(1, "1B0", 3.85, 4.4),     event(1, "1SEND_B0", 4.5, 4.6)};
  const MeasuredCosts m = measure_costs({t}, 2);
  EXPECT_NEAR(m.cost.action_overhead, 0.1, 1e-9);
  EXPECT_NEAR(m.cost.send_overhead, 0.25, 1e-9);
  EXPECT_NEAR(m.cost.recv_overhead, 0.25, 1e-9);
  EXPECT_NEAR(m.cost.comm, 0.15, 1e-9);
  EXPECT_EQ(m.action_samples, 4);
  EXPECT_EQ(m.send_samples, 1);
  EXPECT_EQ(m.recv_samples, 1);
  EXPECT_EQ(m.comm_samples, 2);
}

// A run simulated with overheads (and messages there as they are sent) gives them back, and
// predicts itself.
TEST(CompareToSimulation, SimulatedOverheadsPredictThemselves) {
  for (const char* name : {"1f1b", "zb-v"}) {
    SCOPED_TRACE(name);
    const ValidatedSchedule lowered = validate(make_schedule({name, 2, 8}));
    CostModel truth = CostModel::parse("F=1,I=0.8,W=0.6,action=0.05,send=0.1,recv=0.07");
    const SimResult run = simulate(lowered, truth);
    const Comparison c = compare_to_simulation(lowered, {run.timeline});
    EXPECT_NEAR(c.costs.cost.action_overhead, 0.05, 1e-9);
    EXPECT_NEAR(c.costs.cost.send_overhead, 0.1, 1e-9);
    EXPECT_NEAR(c.costs.cost.recv_overhead, 0.07, 1e-9);
    EXPECT_NEAR(c.predicted.makespan, run.makespan, 1e-9);
    // Printed as if in seconds: in ms.
    EXPECT_NE(format_comparison(c).find("overheads action 50.000"), std::string::npos)
        << format_comparison(c);
    EXPECT_NEAR(comparison_json(c).at("send_overhead_s").get<double>(), 0.1, 1e-9);
  }
}

TEST(MeasureCosts, NeedsAStep) {
  EXPECT_THROW(measure_costs({}, 2), UserError);
}

// A simulated run read back as if measured: the costs come back, and the prediction equals it.
TEST(CompareToSimulation, SimulatedRunPredictsItself) {
  const ValidatedSchedule lowered = validate(make_schedule({"zb-h1", 2, 4}));
  CostModel truth;
  truth.stage_forward = {1.0, 1.5};
  truth.stage_backward_input = {0.8, 1.2};
  truth.stage_backward_weight = {0.5, 0.7};
  const SimResult run = simulate(lowered, truth);
  const Comparison c = compare_to_simulation(lowered, {run.timeline, run.timeline});
  EXPECT_EQ(c.steps, 2);
  const auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) EXPECT_NEAR(got[s], want[s], 1e-9) << "stage " << s;
  };
  expect_near(c.costs.cost.stage_forward, truth.stage_forward);
  expect_near(c.costs.cost.stage_backward_input, truth.stage_backward_input);
  expect_near(c.costs.cost.stage_backward_weight, truth.stage_backward_weight);
  expect_near(c.costs.cost.stage_backward, {0, 0});  // zb-h1 runs no fused B
  EXPECT_NEAR(c.predicted.makespan, run.makespan, 1e-9);
  EXPECT_NEAR(c.measured_makespan, run.makespan, 1e-9);
  EXPECT_NEAR(c.predicted.bubble_ratio, c.measured_bubble_ratio, 1e-9);

  const std::string text = format_comparison(c);
  EXPECT_NE(text.find("predicted"), std::string::npos) << text;
  const auto json = comparison_json(c);
  EXPECT_NEAR(json.at("predicted_makespan_s").get<double>(), run.makespan, 1e-9);
  EXPECT_EQ(json.at("stage_forward_s").size(), 2u);
}

// With data parallelism: the measured all-reduces come back per stage and predict themselves.
TEST(CompareToSimulation, ReductionsAreMeasuredPerStage) {
  const ValidatedSchedule reduced =
      validate(add_grad_reductions(make_schedule({"interleaved-1f1b", 2, 4, 2})));
  CostModel truth;
  truth.replicas = 4;
  truth.stage_grad_bytes = {1e6, 2e6, 3e6, 4e6};
  truth.reduce_bandwidth = 1e6;
  const SimResult run = simulate(reduced, truth);
  const Comparison c = compare_to_simulation(reduced, {run.timeline});
  ASSERT_EQ(c.costs.cost.stage_reduce.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_NEAR(c.costs.cost.stage_reduce[s], truth.reduce_time(s, 4, 2), 1e-9) << "stage " << s;
  }
  EXPECT_NEAR(c.predicted.makespan, run.makespan, 1e-9);
  EXPECT_NE(format_comparison(c).find("  reduce "), std::string::npos);
  EXPECT_EQ(comparison_json(c).at("stage_reduce_s").size(), 4u);
  // Without reductions there is nothing to read.
  const ValidatedSchedule plain = validate(make_schedule({"1f1b", 2, 4}));
  const Comparison none = compare_to_simulation(plain, {simulate(plain, truth).timeline});
  EXPECT_TRUE(none.costs.cost.stage_reduce.empty());
  EXPECT_EQ(format_comparison(none).find("  reduce "), std::string::npos);
}

// A measured fused B is its own figure, not I + W.
TEST(CostModel, PerStageFusedBackwardOverridesTheSum) {
  CostModel c;
  c.stage_backward_input = {1, 1};
  c.stage_backward_weight = {1, 1};
  EXPECT_EQ(c.time(parse_action("1B0"), 2, 2), 2);
  c.stage_backward = {3, 1.5};
  EXPECT_EQ(c.time(parse_action("1B0"), 2, 2), 1.5);
  EXPECT_EQ(c.time(parse_action("1I0"), 2, 2), 1);
}

}  // namespace
}  // namespace pptrain

namespace pptrain {
namespace {

// What the deferred weight gradients hold between I and W counts when given: here 0I0's stash
// (1) is still held while 0F1's activations (2) are, so the peak is 3 instead of 2.
TEST(SimulatorWeightStash, CountedFromIUntilW) {
  const Schedule s = parse_csv("0F0,0I0,0F1,0I1,0W0,0W1\n");
  CostModel cost;
  cost.stage_activation = {2};
  cost.mem_w_ratio = 0;  // I frees everything: the stash is not counted
  EXPECT_EQ(simulate(validate(s), cost).ranks[0].peak_activations, 2);
  cost.mem_w_ratio = 0.5;  // the default: W keeps half of it, 1 per microbatch
  EXPECT_EQ(simulate(validate(s), cost).ranks[0].peak_activations, 3);
  cost.stage_weight_stash = {1};  // a measured stash overrides the ratio
  EXPECT_EQ(simulate(validate(s), cost).ranks[0].peak_activations, 3);
  // A fused B leaves nothing for later.
  EXPECT_EQ(simulate(validate(parse_csv("0F0,0B0,0F1,0B1\n")), cost).ranks[0].peak_activations, 2);
}

}  // namespace
}  // namespace pptrain
