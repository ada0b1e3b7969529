// Predicted against measured: read a run's own per-stage costs off its measured timelines,
// simulate the same schedule with them, and put the two side by side (`pptrain train
// --compare-sim`).
//
//   std::vector<Timeline> steps = ...;   // measured steps, every rank's events on one clock
//   Comparison c = compare_to_simulation(lowered, steps);
//   std::puts(format_comparison(c).c_str());
//   render_svg({steps.back(), c.predicted.timeline}, ...);   // measured above predicted
//
// How the costs are read (all in seconds):
//   F, I, W, B of stage s   per step, the mean duration of that stage's events of that kind over
//                           the microbatches; then the median over the steps. The mean keeps a
//                           step's total (what the makespan is made of); the median over steps
//                           drops a step that a noisy neighbour slowed down. A kind the schedule
//                           does not use on a stage costs 0.
//   comm                    the median, over every transfer whose receiver was already waiting
//                           when the send started (RECV start <= SEND start), of RECV end - SEND
//                           end, less the median length of a RECV whose message was there (that
//                           part is recv_overhead's): how long after the message left the
//                           consumer could take it. Only those transfers show the latency: for
//                           the others the data had arrived before the receiver asked. None (no
//                           receiver ever waited): 0, since the latency then never delayed
//                           anything.
//   overheads               (CostModel::action_overhead, send_overhead, recv_overhead; issue 49)
//                           what a rank spends between its events, read off each rank's events
//                           in order, where the next event is a compute action or a SEND (a gap
//                           before a RECV or a REDUCE_GRAD may hold a wait): action, the gap
//                           after a compute event (the executor's bookkeeping, the receives
//                           posted ahead); send, the length of a SEND plus the gap after it;
//                           recv, the same for a RECV that found its message there (it started
//                           at least the waited transfers' median RECV end - SEND end after its
//                           SEND ended). As for F, I, W: per step the mean, then the median over
//                           the steps. None: 0.
//   all-reduce of stage s   (REDUCE_GRAD, data parallelism) per step the mean duration of the
//                           stage's reductions, then the median over the steps, as
//                           CostModel::stage_reduce; left empty when no step has a reduction.
// The events of all ranks must be on one clock (the runtime aligns them through the host's
// monotonic clock); the simulator's rules are in simulator.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/timeline.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"

namespace pptrain {

struct MeasuredCosts {
  CostModel cost;        // per-stage stage_forward/backward_input/backward_weight/backward, comm,
                         // and stage_reduce when the steps have reductions
  int comm_samples = 0;  // transfers the comm latency was read from
  int action_samples = 0, send_samples = 0, recv_samples = 0;  // the overheads were read from
};

// UserError if `steps` is empty. Events of stages outside [0, num_stages) are ignored.
MeasuredCosts measure_costs(const std::vector<Timeline>& steps, int num_stages);

struct Comparison {
  MeasuredCosts costs;
  SimResult predicted;               // `lowered` simulated with costs.cost
  double measured_makespan = 0;      // seconds, median over the steps (timeline_stats)
  double measured_bubble_ratio = 0;  // median over the steps
  int steps = 0;                     // measured steps used
};

// `schedule`: the schedule that ran. UserError if `steps` is empty.
Comparison compare_to_simulation(const ValidatedSchedule& schedule,
                                 const std::vector<Timeline>& steps);

// A readable block: the per-stage costs, then predicted against measured makespan and bubble.
std::string format_comparison(const Comparison& comparison);

// {"predicted_makespan_s", "measured_makespan_s", "predicted_bubble_ratio",
//  "measured_bubble_ratio", "comm_latency_s", "comm_samples", "action_overhead_s",
//  "send_overhead_s", "recv_overhead_s", "stage_forward_s",
//  "stage_backward_input_s", "stage_backward_weight_s", "stage_backward_s", "stage_reduce_s"
//  (empty without reductions), "steps"}
nlohmann::ordered_json comparison_json(const Comparison& comparison);

}  // namespace pptrain
