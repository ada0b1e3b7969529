#include "pptrain/sim/compare.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "pptrain/common/check.h"
#include "pptrain/common/stats.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/sim/metrics.h"

namespace pptrain {
namespace {

// The kinds a stage has a measured time for, in CostModel's order: compute, then the
// data-parallel all-reduce.
constexpr Op kMeasuredOps[] = {Op::F, Op::I, Op::W, Op::B, Op::REDUCE_GRAD};
constexpr int kKinds = 5;
constexpr int kReduce = 4;

int kind_index(Op op) {
  for (int k = 0; k < kKinds; ++k) {
    if (kMeasuredOps[k] == op) return k;
  }
  return -1;
}

// The latency samples of one step: RECV end - SEND start of every transfer whose receiver was
// waiting before the send started.
void comm_samples(const Timeline& step, std::vector<double>& samples) {
  using Key = std::tuple<int, int, int, int>;  // op, stage, microbatch, peer of the RECV
  const auto key_of = [](const Action& a) {
    return Key{static_cast<int>(a.op), a.stage, a.microbatch, a.peer};
  };
  std::map<Key, const TimelineEvent*> receives;
  for (const auto& e : step.events) {
    if (is_recv(e.action.op)) receives[key_of(e.action)] = &e;
  }
  for (const auto& send : step.events) {
    if (!is_send(send.action.op)) continue;
    const auto it = receives.find(key_of(comm_peer(send.action)));
    if (it == receives.end() || it->second->start > send.start) continue;
    samples.push_back(std::max(0.0, it->second->end - send.start));
  }
}

std::string stage_row(const char* name, const std::vector<double>& seconds) {
  std::string row = name;
  char cell[32];
  for (double s : seconds) {
    std::snprintf(cell, sizeof(cell), " %9.3f", s * 1e3);
    row += cell;
  }
  return row + "\n";
}

}  // namespace

MeasuredCosts measure_costs(const std::vector<Timeline>& steps, int num_stages) {
  PPTRAIN_CHECK(!steps.empty(), "measure_costs needs at least one measured step");
  PPTRAIN_CHECK(num_stages >= 1, "measure_costs: num_stages must be >= 1, got ", num_stages);
  // per_step[k][s]: the step means of kind k on stage s.
  std::vector<std::vector<std::vector<double>>> per_step(
      kKinds, std::vector<std::vector<double>>(num_stages));
  std::vector<double> latencies;
  bool reduced = false;
  for (const Timeline& step : steps) {
    std::vector<std::vector<double>> sum(kKinds, std::vector<double>(num_stages, 0));
    std::vector<std::vector<int>> count(kKinds, std::vector<int>(num_stages, 0));
    for (const auto& e : step.events) {
      const int k = kind_index(e.action.op);
      const int s = e.action.stage;
      if (k < 0 || s < 0 || s >= num_stages) continue;
      sum[k][s] += e.end - e.start;
      ++count[k][s];
    }
    for (int k = 0; k < kKinds; ++k) {
      for (int s = 0; s < num_stages; ++s) {
        if (count[k][s] > 0) per_step[k][s].push_back(sum[k][s] / count[k][s]);
      }
    }
    for (int s = 0; s < num_stages; ++s) reduced = reduced || count[kReduce][s] > 0;
    comm_samples(step, latencies);
  }
  MeasuredCosts out;
  std::vector<double>* targets[kKinds] = {&out.cost.stage_forward, &out.cost.stage_backward_input,
                                          &out.cost.stage_backward_weight, &out.cost.stage_backward,
                                          &out.cost.stage_reduce};
  for (int k = 0; k < kKinds; ++k) {
    // Without reductions stage_reduce stays empty: the cost model's own rule (free at D = 1).
    if (k == kReduce && !reduced) continue;
    for (int s = 0; s < num_stages; ++s) targets[k]->push_back(median(per_step[k][s]));
  }
  out.cost.comm = median(latencies);
  out.comm_samples = static_cast<int>(latencies.size());
  return out;
}

Comparison compare_to_simulation(const ValidatedSchedule& schedule,
                                 const std::vector<Timeline>& steps) {
  Comparison c;
  c.costs = measure_costs(steps, schedule->num_stages);
  c.predicted = simulate(schedule, c.costs.cost);
  c.predicted.timeline.unit = TimeUnit::kSeconds;  // the costs were measured in seconds
  std::vector<double> makespans, bubbles;
  for (const Timeline& step : steps) {
    const TimelineStats stats = timeline_stats(step);
    makespans.push_back(stats.makespan);
    bubbles.push_back(stats.bubble_ratio);
  }
  c.measured_makespan = median(makespans);
  c.measured_bubble_ratio = median(bubbles);
  c.steps = static_cast<int>(steps.size());
  return c;
}

std::string format_comparison(const Comparison& c) {
  const CostModel& cost = c.costs.cost;
  std::string out = "predicted vs measured (costs: medians over " + std::to_string(c.steps) +
                    " measured step" + (c.steps == 1 ? "" : "s") + ")\n";
  std::string header = "  stage ms ";
  char cell[64];
  for (size_t s = 0; s < cost.stage_forward.size(); ++s) {
    std::snprintf(cell, sizeof(cell), " %9zu", s);
    header += cell;
  }
  out += header + "\n";
  out += stage_row("  F        ", cost.stage_forward);
  out += stage_row("  I        ", cost.stage_backward_input);
  out += stage_row("  W        ", cost.stage_backward_weight);
  out += stage_row("  B        ", cost.stage_backward);
  if (!cost.stage_reduce.empty()) out += stage_row("  reduce   ", cost.stage_reduce);
  std::snprintf(cell, sizeof(cell), "  comm latency %.3f ms (from %d waiting receive%s)\n",
                cost.comm * 1e3, c.costs.comm_samples, c.costs.comm_samples == 1 ? "" : "s");
  out += cell;
  const double error = c.measured_makespan > 0 ? (c.predicted.makespan - c.measured_makespan) /
                                                     c.measured_makespan * 100
                                               : 0;
  char line[160];
  std::snprintf(line, sizeof(line),
                "  makespan  predicted %.4f s  measured %.4f s  (prediction %+.1f%%)\n",
                c.predicted.makespan, c.measured_makespan, error);
  out += line;
  std::snprintf(line, sizeof(line), "  bubble    predicted %.3f    measured %.3f\n",
                c.predicted.bubble_ratio, c.measured_bubble_ratio);
  out += line;
  return out;
}

nlohmann::ordered_json comparison_json(const Comparison& c) {
  const CostModel& cost = c.costs.cost;
  return {{"predicted_makespan_s", c.predicted.makespan},
          {"measured_makespan_s", c.measured_makespan},
          {"predicted_bubble_ratio", c.predicted.bubble_ratio},
          {"measured_bubble_ratio", c.measured_bubble_ratio},
          {"comm_latency_s", cost.comm},
          {"comm_samples", c.costs.comm_samples},
          {"stage_forward_s", cost.stage_forward},
          {"stage_backward_input_s", cost.stage_backward_input},
          {"stage_backward_weight_s", cost.stage_backward_weight},
          {"stage_backward_s", cost.stage_backward},
          {"stage_reduce_s", cost.stage_reduce},
          {"steps", c.steps}};
}

}  // namespace pptrain
