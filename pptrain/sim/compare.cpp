#include "pptrain/sim/compare.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

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

// Every transfer of one step whose SEND and RECV are both in it: {SEND, RECV}.
std::vector<std::pair<const TimelineEvent*, const TimelineEvent*>> transfers(const Timeline& step) {
  using Key = std::tuple<int, int, int, int>;  // op, stage, microbatch, peer of the RECV
  const auto key_of = [](const Action& a) {
    return Key{static_cast<int>(a.op), a.stage, a.microbatch, a.peer};
  };
  std::map<Key, const TimelineEvent*> receives;
  for (const auto& e : step.events) {
    if (is_recv(e.action.op)) receives[key_of(e.action)] = &e;
  }
  std::vector<std::pair<const TimelineEvent*, const TimelineEvent*>> out;
  for (const auto& send : step.events) {
    if (!is_send(send.action.op)) continue;
    const auto it = receives.find(key_of(comm_peer(send.action)));
    if (it != receives.end()) out.push_back({&send, it->second});
  }
  return out;
}

// Whether the receiver was waiting before the send started (RECV start <= SEND start): then
// RECV end - SEND end is the transfer and the taking of the message.
bool waited(const TimelineEvent& send, const TimelineEvent& recv) {
  return recv.start <= send.start;
}

// The samples of one step, in seconds: `latencies` (RECV end - SEND end of the transfers whose
// receiver waited).
void latency_samples(const Timeline& step, std::vector<double>& latencies) {
  for (const auto& [send, recv] : transfers(step)) {
    if (waited(*send, *recv)) latencies.push_back(std::max(0.0, recv->end - send->end));
  }
}

struct OverheadSamples {
  std::vector<double> action, send, recv, taking;  // seconds; `taking`: arrived RECVs' lengths
};

// Per step the mean of each kind's samples (a step's total: what its makespan is made of, the
// rare long gap of a descheduled process included), to take the median over the steps of, as
// for the compute times.
struct OverheadMeans {
  OverheadSamples means;  // [step] one mean per step that has samples of the kind
  int action_samples = 0, send_samples = 0, recv_samples = 0;
  void add_step_means(const OverheadSamples& step) {
    const auto add = [](const std::vector<double>& samples, std::vector<double>& to) {
      if (samples.empty()) return;
      double sum = 0;
      for (double x : samples) sum += x;
      to.push_back(sum / static_cast<double>(samples.size()));
    };
    add(step.action, means.action);
    add(step.send, means.send);
    add(step.recv, means.recv);
    add(step.taking, means.taking);
    action_samples += static_cast<int>(step.action.size());
    send_samples += static_cast<int>(step.send.size());
    recv_samples += static_cast<int>(step.recv.size());
  }
};

// The overhead samples of one step (see compare.h). `waited_latency`: the median of the
// latency samples; a receive at least that long after its SEND ended found its message there.
void overhead_samples(const Timeline& step, double waited_latency, OverheadSamples& out) {
  std::map<const TimelineEvent*, bool> arrived;  // RECV -> found its message there
  for (const auto& [send, recv] : transfers(step)) {
    arrived[recv] = recv->start >= send->end + waited_latency;
  }
  std::map<int, std::vector<const TimelineEvent*>> by_rank;
  for (const auto& e : step.events) by_rank[e.rank].push_back(&e);
  for (auto& [rank, events] : by_rank) {
    std::stable_sort(
        events.begin(), events.end(),
        [](const TimelineEvent* a, const TimelineEvent* b) { return a->start < b->start; });
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      const TimelineEvent& e = *events[i];
      const TimelineEvent& next = *events[i + 1];
      // Only a gap before a compute action or a SEND is all overhead: one before a RECV or a
      // REDUCE_GRAD may hold a wait (a simulated timeline starts a RECV when its message came).
      if (!is_compute(next.action.op) && !is_send(next.action.op)) continue;
      const double gap = std::max(0.0, next.start - e.end);
      const double length = std::max(0.0, e.end - e.start);
      if (is_compute(e.action.op)) {
        out.action.push_back(gap);
      } else if (is_send(e.action.op)) {
        out.send.push_back(length + gap);
      } else if (is_recv(e.action.op)) {
        const auto it = arrived.find(&e);
        if (it == arrived.end() || !it->second) continue;
        out.recv.push_back(length + gap);
        out.taking.push_back(length);
      }
    }
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
  for (const Timeline& step : steps) latency_samples(step, latencies);
  const double waited_latency = median(latencies);
  OverheadMeans overheads;
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
    OverheadSamples samples;
    overhead_samples(step, waited_latency, samples);
    overheads.add_step_means(samples);
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
  out.cost.action_overhead = median(overheads.means.action);
  out.cost.send_overhead = median(overheads.means.send);
  out.cost.recv_overhead = median(overheads.means.recv);
  // The waited receive's length holds the taking of the message, which recv_overhead counts.
  out.cost.comm = std::max(0.0, waited_latency - median(overheads.means.taking));
  out.comm_samples = static_cast<int>(latencies.size());
  out.action_samples = overheads.action_samples;
  out.send_samples = overheads.send_samples;
  out.recv_samples = overheads.recv_samples;
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
  char overheads[160];
  std::snprintf(overheads, sizeof(overheads),
                "  overheads action %.3f ms  send %.3f ms  recv %.3f ms (from %d, %d, %d)\n",
                cost.action_overhead * 1e3, cost.send_overhead * 1e3, cost.recv_overhead * 1e3,
                c.costs.action_samples, c.costs.send_samples, c.costs.recv_samples);
  out += overheads;
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
          {"action_overhead_s", cost.action_overhead},
          {"send_overhead_s", cost.send_overhead},
          {"recv_overhead_s", cost.recv_overhead},
          {"stage_forward_s", cost.stage_forward},
          {"stage_backward_input_s", cost.stage_backward_input},
          {"stage_backward_weight_s", cost.stage_backward_weight},
          {"stage_backward_s", cost.stage_backward},
          {"stage_reduce_s", cost.stage_reduce},
          {"steps", c.steps}};
}

}  // namespace pptrain
