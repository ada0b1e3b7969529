// What one training step did, as rank 0 hands it to the observers (observers.h).
//
// Every rank measures its own share of a step (RankStep: its loss if it holds the last stage,
// its timed actions, its peak activation memory); gather_step_report() sends them to rank 0,
// which puts every rank's events on its own clock and returns one StepReport.
//
//   RankStep mine = ...;                             // this rank's measurements
//   if (auto report = gather_step_report(plan, step, grad_norm, mine, transport))
//     for (StepObserver* o : observers) o->on_step(*report);   // rank 0 only
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/timeline.h"
#include "pptrain/sim/memory_model.h"
#include "pptrain/sim/metrics.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// One rank's measurements of one step.
struct RankStep {
  bool has_loss = false;              // true on the rank holding the last stage
  double loss = 0;                    // mean over the mini-batch
  int64_t peak_activation_bytes = 0;  // allocated during the step, above its start
  double seconds = 0;                 // common start to this rank's optimizer step done
  double start_s = 0;  // the step's start on the host's steady clock: aligns the ranks' events
  // Asynchronous schedules: the squared norm of the gradients of this rank's latest optimizer
  // steps (one per stage), and the most weight versions one of its stages held in the step.
  double grad_norm_squared = 0;
  int weight_versions = 1;
  int64_t optimizer_state_bytes = 0;  // held by this rank's optimizers after the step
  // Pipeline messages and its share of collectives (a ring all-reduce of N bytes over D ranks
  // sends 2 (D-1) / D x N from each) sent in the step.
  int64_t bytes_sent = 0;
  // The most bytes of weights held at once in the step: the live weights, and every version,
  // prediction, correction buffer or averaging centre beside them.
  int64_t weight_bytes = 0;
  // CPU seconds of its F, I, W and B actions (thread CPU time: what sharing a core with other
  // processes does not stretch, unlike their wall times in `events`).
  double compute_s = 0;
  // --post-validation: 1 when this rank took its optimizer step back (and redid it clipped).
  int rollbacks = 0;
  // fp16 (api/pipeline.h, PipelineOptions::precision): the loss scale the step ran at, and
  // whether its gradients overflowed, so that every rank skipped its optimizer step. The same on
  // every rank.
  double loss_scale = 0;
  bool skipped = false;
  // Seconds the step loop waited for a checkpoint at the end of the step (PipelineOptions::
  // at_step_end): the copy of a background save, or the whole of a synchronous one.
  double checkpoint_stall_s = 0;
  int64_t resident_bytes = 0;  // the process's RSS at the step's end (device/memory.h)
  // The most bytes of tensors the rank held at once from the step's start to its optimizer step
  // done (the counting allocator, device/memory.h): weights and their versions, gradients,
  // optimizer state, activations kept for backward, temporaries and messages. The stages'
  // parameters (and gradients) made before the allocator was installed are added; a
  // checkpoint's copies (at_step_end) are not counted.
  int64_t peak_memory_bytes = 0;
  // The memory model's prediction of that peak (sim/memory_model.h) from this rank's stages'
  // parameters, its optimizers' kind and the bytes a microbatch held on each of its stages,
  // measured in the step (runtime/executor.h: measured_stage_bytes); in parts. The total is the
  // first step's (fresh optimizer state is made after the backwards) or the steady one.
  RankMemory predicted_memory;
  int64_t predicted_peak_memory_bytes = 0;
  std::vector<TimelineEvent> events;  // seconds since the step start
};

struct StepReport {
  int step = 0;              // 1-based
  int steps = 0;             // of the run
  double loss = 0;           // mean over the mini-batch
  double grad_norm = 0;      // global, before clipping (asynchronous: of each stage's latest step)
  double step_seconds = 0;   // the slowest rank's
  double samples_per_s = 0;  // batch_size / step_seconds
  double tokens_per_s = 0;   // samples_per_s x tokens per sample
  std::vector<double> rank_seconds;                  // [rank]
  std::vector<int64_t> peak_activation_bytes;        // [rank]
  std::vector<int> weight_versions;                  // [rank]: most versions held at once
  std::vector<int64_t> optimizer_state_bytes;        // [rank]: after the step
  std::vector<int64_t> bytes_sent;                   // [rank]: RankStep::bytes_sent
  std::vector<int64_t> weight_bytes;                 // [rank]: RankStep::weight_bytes
  std::vector<double> compute_s;                     // [rank]: RankStep::compute_s
  int rollbacks = 0;                                 // ranks that took their optimizer step back
  double loss_scale = 0;                             // fp16's: RankStep::loss_scale (0: none)
  bool skipped = false;                              // fp16: every rank skipped the step
  double checkpoint_stall_s = 0;                     // the longest RankStep::checkpoint_stall_s
  std::vector<int64_t> resident_bytes;               // [rank]: RankStep::resident_bytes
  std::vector<int64_t> peak_memory_bytes;            // [rank]: RankStep::peak_memory_bytes
  std::vector<int64_t> predicted_peak_memory_bytes;  // [rank]: RankStep's
  std::vector<RankMemory> predicted_memory;          // [rank]: RankStep's, in parts
  Timeline timeline;    // measured, seconds, every rank on rank 0's clock
  TimelineStats stats;  // of `timeline`: makespan, bubble ratio, ...

  // The run's last step; never when the run's length is not known (a program's own loop).
  bool last() const { return steps > 0 && step == steps; }
};

// What the step reports and their observers know of a run, whoever runs it: `pptrain train`
// (run_info() of its TrainingPlan) or a program's own loop (api/pipeline.h).
struct RunInfo {
  explicit RunInfo(ValidatedSchedule lowered) : schedule(std::move(lowered)) {}

  ValidatedSchedule schedule;  // what every rank of one pipeline runs
  int copies = 1;              // D: copies of the pipeline (--dp)
  int microbatches = 1;        // M, per step
  int steps = 0;               // of the run; 0 when not known in advance
  int first_step = 0;          // 0-based; a resumed run's first
  int64_t batch_size = 0;      // samples per step over all copies
  // [copy] = its samples per step when the copies' shares are unequal (--dp-shares); empty:
  // batch_size / copies each.
  std::vector<int> dp_shares;
  double tokens_per_sample = 1;
  bool asynchronous = false;
  std::string header;  // what the log prints before the first step (lines, no final newline)
  // The link of each pair of ranks that exchange the pipeline's messages, as their transports
  // reported it (runtime/links.h): {"0-1", "shm"}, {"1-2", "gloo"}; empty for one rank.
  std::vector<std::pair<std::string, std::string>> links;
  // The layers of each stage, "0-2,3-5" (--stage-layers' form); empty when the stages are a
  // program's own modules.
  std::string stage_layers;
  // How many times the launcher started the run again (cluster_env.h: restart_count): the
  // metrics of a restart go on in the file its first start wrote.
  int restart = 0;
  std::string save_dir;  // where the run saves at its end; empty: it does not
  // The run goes on after `train --replan auto` moved its layers (the same run, perhaps another
  // process reporting): what the observers write is continued, not started again.
  bool continues = false;

  int ranks() const { return schedule->num_ranks; }
  int world_size() const { return copies * ranks(); }
  // "1f1b, P=2, M=8" (with ", D=2" for copies): what a picture of the run is titled.
  std::string title() const;
};

// What `pptrain train`'s observers know of its plan.
RunInfo run_info(const TrainingPlan& plan);

// Collective over all ranks: every rank sends `mine` to rank 0, which returns the step's report;
// the other ranks return nothing. `step` is 0-based. With `unsent` given, the other ranks do not
// wait for their sends but append them there (an asynchronous pipeline must not wait for rank 0
// at every step); the caller waits on them later.
std::optional<StepReport> gather_step_report(const RunInfo& run, int step, double grad_norm,
                                             const RankStep& mine, Transport& transport,
                                             std::vector<PendingComm>* unsent = nullptr);

}  // namespace pptrain
