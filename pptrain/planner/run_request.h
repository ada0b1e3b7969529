// A training run described once, and resolved by one function: the schedule it runs (a
// ScheduleRequest: the schedule and its family's options, pipeline and data-parallel degrees,
// replicas, skips, memory limit) and what training adds to it (the optimizer pptrain steps,
// ZeRO, recomputation, the parameters tied between stages). `pptrain train` (plan_training()),
// the C++ library's PipelineSchedule (and so Python) and `pptrain schedule` each describe their
// run as a RunRequest and call resolve_run(), so every rule of what may run with what, and every
// check of these options, is stated here once, its errors naming each option as the caller
// names it (OptionNames).
//
//   RunRequest request;
//   request.schedule.schedule = "pipedream";
//   request.schedule.pp = 4;
//   request.schedule.microbatches = 8;
//   request.optimizer = OptimizerOptions{"sgd", /*lr=*/0.05};
//   request.ties = {{"embedding", {0, -1}}};   // the first stage and the last
//   ResolvedRun run = resolve_run(request, CostModel());   // UserError, one line, if it cannot
//
// No LibTorch here: the planner plans with the same options.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/planner/schedule_request.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {

// How pptrain steps the optimizers: `pptrain train`'s --optimizer, --lr, --momentum,
// --warmup-steps, --clip, --post-validation, --exact-rollback and --skip-nonfinite, and a
// program's PipelineOptions::optimizer (api/pipeline.h). train/optimizer.h runs them.
struct OptimizerOptions {
  std::string kind = "sgd";  // "sgd" (with momentum) or "adamw" (weight decay 0.01)
  double lr = 0.05;
  double momentum = 0.9;  // sgd's
  int warmup_steps = 0;   // the rate grows linearly to lr over this many steps; 0: none
  double clip = 0;        // max global gradient norm (torch's clip_grad_norm_); 0: no clipping
  // The zero-bubble paper's post-validation (section 4): no all-reduce of the gradient norm
  // before a synchronous step; a step that should have clipped is taken back and redone
  // (api/pipeline.h). With exact_rollback the undo restores saved copies instead of inverting
  // AdamW's or SGD's update.
  bool post_validation = false;
  bool exact_rollback = false;
  // A step whose gradient norm is not finite skips its optimizer step instead of stopping the
  // run.
  bool skip_nonfinite = false;

  // The learning rate of the optimizer steps of step `step` (0-based): the warm-up's share of lr.
  double lr_at(int step) const {
    return warmup_steps > 0 && step < warmup_steps ? lr * (step + 1) / warmup_steps : lr;
  }
};

// Bytes of optimizer state per byte of parameters a step makes: AdamW 2 (its two moments), SGD
// 1 with momentum (its buffer), else 0.
double state_bytes_per_parameter_byte(const OptimizerOptions& options);

// A parameter shared between stages: each stage in `stages` keeps a copy (declared with
// PipelineStage::tie). pptrain makes the copies equal before the first step (the lowest stage's
// values), and after each step's backwards sums their gradients over all copies (one all-reduce
// over the ranks that hold them), before clipping and the optimizer step; so the copies stay
// equal bit for bit, and training equals one process with one shared tensor. Under pipedream
// and 2bw (with PipelineOptions::optimizer) the first stage's copy takes each update and the
// others follow it a few updates late, equal again after the last step (docs/ASYNC.md).
// A stage below 0 counts from the last, as Python's indices do: {0, -1} is the first stage and
// the last, one stage on a one-stage pipeline.
struct TiedParameter {
  std::string name;
  std::vector<int> stages;
};

// A skip connection: the tensor `name` of stage `from`'s output (a named bundle) goes straight to
// stage `to` > `from`, not through the stages between: `to` takes it beside what stage to - 1
// sends, and its gradient comes back the same way. The tensors from one stage to another travel
// in the skip messages of the schedule (Schedule::skips: skip_links() of these), one each way
// per microbatch, or are handed over when both stages are on one rank. A skip to the next stage
// (to = from + 1) is simply part of the ordinary message.
struct SkipConnection {
  std::string name;
  int from = 0;
  int to = 0;
};
// The stage pairs whose skip connections need messages of their own: Schedule::skips for them.
std::vector<SkipLink> skip_links(const std::vector<SkipConnection>& skips);

struct RunRequest {
  ScheduleRequest schedule;
  // Set: pptrain steps the optimizers (it always does for `pptrain train`), and these are
  // checked. Unset: the program steps its own (the C++ library, Python), or nothing trains
  // (`pptrain schedule`).
  std::optional<OptimizerOptions> optimizer;
  int zero = 0;  // 1: the optimizer state sharded over the data-parallel copies (ZeRO stage 1)
  // The samples per step of each of the schedule.dp copies (partition/workers.h: data-parallel
  // shares): one per copy, each a multiple of the microbatches; unequal ones not with a
  // schedule whose copies average their weights (avgpipe). Empty: equal shares.
  std::vector<int> dp_shares;
  bool recompute = false;  // keep only each stage's input between F and its backward
  std::vector<TiedParameter> ties;
  // Skip connections (synchronous schedules), their messages added to the schedule's. Those of
  // a model cut into stages by the run are known only then: with_skips() adds them.
  std::vector<SkipConnection> skips;
};

// What runs: the schedule with its weight rule, and the training's options checked against it.
struct ResolvedRun {
  explicit ResolvedRun(RequestedSchedule made) : schedule(std::move(made)) {}

  RequestedSchedule schedule;
  std::optional<OptimizerOptions> optimizer;
  int zero = 0;
  bool recompute = false;
  // Each tie's stages as numbers of 0..S-1, ascending and distinct.
  std::vector<TiedParameter> ties;
  std::vector<SkipConnection> skips;
};

// Makes and checks the run `request` describes (`cost`: what zb-auto plans for, as
// make_requested_schedule() takes it). UserError naming the option for anything that cannot
// run, or the schedule's own errors.
ResolvedRun resolve_run(const RunRequest& request, const CostModel& cost);
// The same checks of a schedule made already (the plan `pptrain train` hands the library, a
// model's skips added with with_skips()): `made` stands for request.schedule.
ResolvedRun resolve_run(RequestedSchedule made, const RunRequest& request);

// `run` with skip connections (a model's, between the stages its layers were cut into), checked
// as resolve_run() checks a request's: UserError for a skip on an asynchronous schedule (naming
// `names.skips`), one without a name or whose stages are not 0 <= from < to < S, or two of one
// name from one stage.
ResolvedRun with_skips(ResolvedRun run, std::vector<SkipConnection> skips,
                       const OptionNames& names);

// UserError naming the option (`names`) for settings pptrain's optimizers do not take: another
// kind than sgd or adamw, a rate that is not above 0, momentum outside [0, 1) or given to
// adamw, a negative warm-up or clip, exact rollback without post-validation.
void check_optimizer(const OptimizerOptions& optimizer, const OptionNames& names);

}  // namespace pptrain
