// A training run's two halves: what `pptrain train` was asked for (TrainOptions, the flags as
// given) and what that means (TrainingPlan: the validated schedule, which layers each stage
// holds, which stages each rank runs, the microbatch size, the optimizer's settings).
// plan_training() (plan_training.h) makes the one from the other.
//
//   TrainOptions options;                      // from the command line
//   TrainingPlan plan = plan_training(options, /*may_profile=*/true);   // every user error there
//   train(plan, transport, observers);         // job/trainer.h: reads the plan, never changes it
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "pptrain/common/device.h"
#include "pptrain/common/precision.h"
#include "pptrain/data/data.h"
#include "pptrain/generators/registry.h"
#include "pptrain/models/model.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/train/optimizer.h"
#include "pptrain/train/partition_plan.h"

namespace pptrain {

// The flags of `pptrain train`, as the user gave them.
struct TrainOptions {
  ModelOptions model;
  DataOptions data;  // batch_size, microbatches (M), seed, source
  int pp = 1;        // P: worker processes per pipeline
  // D: copies of the pipeline, each on its own P processes (world size D x P). --batch-size is
  // the global batch: each copy trains on its 1/D of it, and each stage's D copies average their
  // gradients before the optimizer step.
  int dp = 1;
  // The samples of each step's batch each copy trains on, "24,8" (partition/workers.h: data-
  // parallel shares; D positive multiples of M summing to --batch-size): a copy holding a slower
  // rank takes fewer, and the copies' gradients are weighed by their shares. Empty: 1/D each.
  std::string dp_shares;
  // 1: each of the D copies keeps the optimizer state of about 1/D of its stages' layers, steps
  // those and hands their new weights to the other copies (ZeRO stage 1); 0: every copy keeps
  // all of it.
  int zero = 0;
  int chunks = 0;  // V: stages per rank; 0 = the schedule's default
  // Which layers each stage holds: uniform | params | time | workers | FILE.json
  // (partition_plan.h).
  std::string partition = "uniform";
  std::string stage_layers;  // resolved ranges "0-2,3-5" (a launcher's); wins over partition
  // "auto": the ranks watch each other's compute and move layers off a rank that falls behind
  // (job/worker_speeds.h, partition/straggler.h); "off": the cut stays.
  std::string replan = "off";
  // --partition workers: where rank 0 writes what the ranks measured (partition/workers.h), for
  // `pptrain plan --workers-profile`. Empty: nowhere.
  std::string save_workers;
  // --partition workers: each rank's memory limit in bytes, "BYTES" for all or "B0,B1,..." per
  // world rank (partition/workers.h: parse_worker_memory_limits), instead of its cgroup's; the
  // cut keeps every rank's peak, by the planner's memory model, within its own. Empty: cgroups'.
  std::string worker_memory_limits;
  // Which worker (launch rank) runs each rank of the run, "1,0" ([world rank] = worker,
  // partition/workers.h: parse_placement); empty: rank r on worker r. --partition workers chooses
  // its own when not given.
  std::string placement;
  std::string schedule = "1f1b";  // a registry name (generators/registry.h)
  std::string schedule_file;      // or a CSV schedule for P ranks (takes precedence)
  // What the log and pictures call the schedule file's order; empty: the file's own name
  // ("imported"). --plan sets it to the planned schedule's name.
  std::string schedule_file_name;
  // The cost model zb-auto plans for (sim/cost_model.h: "F=1,I=1,W=1,comm=0", one rank's
  // share). Empty: the per-stage times of the profile `partition` names, if it is a profile
  // file, else F=1,I=1,W=1,comm=0.
  std::string cost;
  // Cap on every rank's peak activations in memory-model units (generators/auto_schedule.h):
  // zb-auto plans under it, another schedule whose simulated peak is above it is refused. 0: none.
  double memory_limit = 0;
  // How zb-auto orders its actions: "heuristic" or "ilp" (generators/registry.h), and the ILP's
  // wall-time limit in seconds.
  std::string solver = "heuristic";
  double time_limit_s = 60;
  // With --solver ilp, what the launcher passes its workers: the order it solved, as a CSV file
  // (a time limit could end differently in each process). Empty: solve here.
  std::string solved_schedule;
  double mem_w_ratio = 0.5;  // r: the share of a microbatch's activations W keeps after I
  // With --pp 1: the model in this many stages, run one after the other in this process (the
  // reference of an asynchronous schedule on that many stages). 0: one stage.
  int stages = 0;
  // The options of the schedule's family that were given, by flag (generators/registry.h:
  // FamilyOption; e.g. {"--update-interval", 2}); the others take their family's default.
  FamilyValues family;
  int steps = 10;
  std::string optimizer = "sgd";  // "sgd" (with momentum) or "adamw" (weight decay 0.01)
  double lr = 0;                  // 0: 0.05 for sgd, 1e-3 for adamw
  double momentum = 0.9;          // sgd's momentum
  int warmup_steps = 0;           // the rate grows linearly to lr over this many steps; 0: none
  double clip = 1.0;              // max global gradient norm; 0 = no clipping
  std::string metrics_path;       // JSON lines, one per step
  std::string trace_path;         // Chrome trace of the last step
  std::string svg_path;           // SVG timeline of the last step
  std::string save_dir;           // a checkpoint after the last step (train/checkpoint.h)
  int save_every = 0;             // also after every this many steps; 0: at the end only
  int keep = 1;                   // checkpoints kept: DIR and up to keep - 1 DIR.step-<k>
  bool sync_save = false;         // write checkpoints in the step loop, not in the background
  std::string load_dir;           // parameters to start from (a checkpoint), at step 0
  std::string resume_dir;         // a checkpoint to continue: parameters, optimizer, step;
                                  // "auto": the newest whole one in save_dir, or none
  int max_restarts = 0;           // the launcher starts a failed run again, from save_dir
  int threads = 1;                // compute threads per process (workers: P processes, P cores)
  int stopped_timeout_s = 60;     // the launcher stops the run when a worker is stopped this long
  // A receive, collective or rendezvous fails after this many seconds without an answer (a hung
  // peer); 0: PPTRAIN_COMM_TIMEOUT_S if set, else transport.h's default (60).
  int comm_timeout_s = 0;
  bool quiet = false;  // no per-step lines on stdout
  // Keep only each stage's input between F and its backward, and rerun F before I or B.
  bool recompute = false;
  // How I and W divide a backward (runtime/executor.h, ExecutorOptions::WeightSplit):
  // "deferred" (PipeLinear's own closures, the fast path) or "autograd" (any module's way: two
  // passes over the graph). Synchronous schedules only.
  std::string weight_split = "deferred";
  // Optimizer post-validation (the zero-bubble paper's section 4): no all-reduce of the gradient
  // norm before the optimizer step. The ranks pass the partial sum of squared norms along the
  // pipeline, each steps at once unless its partial sum already calls for clipping (or is not
  // finite), and takes the step back and redoes it when the full sum, sent back by the last
  // rank, says it should have clipped (or skipped). The same result as without it.
  bool post_validation = false;
  bool exact_rollback = false;  // undo from saved copies instead of AdamW's/SGD's inverse
  // After the last step, simulate the schedule with this run's own measured costs and print
  // predicted against measured (sim/compare.h); with svg_path, draw both timelines.
  bool compare_sim = false;
  // A step whose loss or gradients are not finite skips its optimizer step instead of stopping
  // the run.
  bool skip_nonfinite = false;
  // --precision: "fp32", "bf16" or "fp16" (common/precision.h; api/pipeline.h,
  // PipelineOptions::precision, says what each computes in).
  std::string precision = "fp32";
  // --weight-casts: "microbatch" (each use casts the float32 weight) or "step" (each weight cast
  // once per step, ExecutorOptions::casts_per_step).
  std::string weight_casts = "microbatch";
  // --device: "cpu", "cuda" or "auto" (common/device.h; device/placement.h decides each rank's).
  std::string device = "cpu";
};

// What a run is. Read-only once made.
struct TrainingPlan {
  explicit TrainingPlan(ValidatedSchedule validated) : schedule(std::move(validated)) {}

  ModelOptions model;
  DataOptions data;
  // D: copies of the pipeline (--dp). World rank w runs pipeline rank w % P of copy w / P.
  int copies = 1;
  // [copy] = the samples of each step's batch it trains on (--dp-shares, unequal); empty: equal
  // shares, batch_size / D each.
  std::vector<int> dp_shares;
  int zero = 0;  // --zero: 1 shards the optimizer state over the D copies (train/stage_copies.h)
  // The schedule every rank runs, with its SEND/RECV actions. With --pp 1 every schedule name
  // means the same single-stage run: all microbatches' forwards, then all their backwards.
  // An asynchronous schedule is one list over the whole run: steps x M microbatches.
  ValidatedSchedule schedule;
  // Which weights each action uses and when the optimizers step (kFlush: synchronous).
  VersionRule weights;
  // The options of the schedule's family that were given (TrainOptions::family), checked.
  FamilyValues family;
  // avgpipe: the --dp copies combine no gradients and pull their weights together
  // (train/stage_copies.h: copy_averaging(family)); false: they combine gradients as usual.
  bool averages_copies = false;
  std::vector<LayerRange> stage_layers;  // [num_stages]: layers [first, last] of each stage
  // The model's skip connections between stages (unet), by the stages of their two layers;
  // schedule->skips are their skip_links().
  std::vector<SkipConnection> skips;
  // Parameters tied between stages, stages numbered (--tie-embeddings: the embedding's table on
  // the first stage and the head on the last).
  std::vector<TiedParameter> ties;
  std::string partition;  // how stage_layers was chosen, for the log
  // [world rank] = the worker (launch rank, the process's RANK) that runs it; empty: the
  // identity. The runtime sees only ranks: its transport is placed (runtime/group.h).
  std::vector<int> placement;
  bool replan = false;  // --replan auto
  // Samples per microbatch: batch_size / (D x M), rounded down, at least 1; what a cut is
  // profiled and planned at. Each copy's own: copy_microbatch_size(d).
  int64_t microbatch_size = 0;
  double tokens_per_sample = 1;  // gpt: seq_len (0 with --seq-len-range: each batch's); mlp: 1
  int steps = 0;
  // --optimizer (its lr resolved: never 0), --momentum, --warmup-steps, --clip,
  // --post-validation, --exact-rollback, --skip-nonfinite.
  OptimizerOptions optimizer;
  bool recompute = false;
  Precision precision = Precision::kFp32;      // --precision
  bool casts_per_step = false;                 // --weight-casts step
  DeviceRequest device = DeviceRequest::kCpu;  // --device
  bool autograd_weight_split = false;          // TrainOptions::weight_split == "autograd"
  int threads = 1;                             // compute threads per process
  std::string load_dir;                        // empty: start from the seeded initialisation
  std::string resume_dir;  // empty: no resume; else also the optimizer state and the step
  // --resume auto: the checkpoints passed over (why each could not be continued); `finished`:
  // save_dir holds the checkpoint of the run's last step, so nothing is left to run.
  std::vector<std::string> resume_skipped;
  bool finished = false;
  int first_step = 0;  // the step the run starts at: the resumed checkpoint's step
  // The precision the resumed checkpoint was trained at (its manifest's); empty: no resume.
  std::string resumed_precision;
  std::string save_dir;  // empty: do not save
  int save_every = 0;    // see TrainOptions
  int keep = 1;          // see TrainOptions
  // Checkpoints are copied at the step boundary and written by a thread while training goes on
  // (train/checkpoint.h's CheckpointWriter); false: in the step loop (--sync-save).
  bool background_save = true;
  // The checkpoint whose parameters the run starts from; empty: the seeded initialisation.
  const std::string& start_dir() const { return resume_dir.empty() ? load_dir : resume_dir; }

  int ranks() const { return schedule->num_ranks; }  // P: ranks of one pipeline
  int world_size() const { return copies * ranks(); }
  int pipeline_rank(int world_rank) const { return world_rank % ranks(); }
  int copy_of(int world_rank) const { return world_rank / ranks(); }
  // Copy d trains on rows [copy_first_sample(d), + copy_samples(d)) of each step's batch.
  int64_t copy_samples(int copy) const {
    return dp_shares.empty() ? data.batch_size / copies : dp_shares[copy];
  }
  int64_t copy_first_sample(int copy) const {
    int64_t first = 0;
    for (int d = 0; d < copy; ++d) first += copy_samples(d);
    return first;
  }
  int64_t copy_microbatch_size(int copy) const { return copy_samples(copy) / microbatches(); }
  // (The groups of a pipeline's ranks and of a stage's copies are PipelineSchedule's.)
  int num_stages() const { return schedule->num_stages; }
  int microbatches() const { return data.microbatches; }  // M, per step
  bool asynchronous() const { return weights.asynchronous(); }
  // Of a pipeline rank (0 .. P-1).
  std::vector<int> stages_of(int rank) const { return schedule->stages_of(rank); }
  // Whether the rank runs the first (last) stage for some microbatch: it reads the inputs
  // (targets). A replicated stage has several such ranks.
  bool holds_first_stage(int rank) const { return holds_stage(0, rank); }
  bool holds_last_stage(int rank) const { return holds_stage(num_stages() - 1, rank); }
  bool holds_stage(int stage, int rank) const {
    const std::vector<int> ranks = schedule->replicas_of(stage);
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  }
};

}  // namespace pptrain
