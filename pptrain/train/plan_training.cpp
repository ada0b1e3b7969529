#include "pptrain/train/plan_training.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "pptrain/common/check.h"
#include "pptrain/device/placement.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/workers.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/sim/simulator.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/stage_copies.h"

namespace pptrain {
namespace {

void check_output_path(const std::string& path, const char* flag) {
  if (path.empty()) return;
  PPTRAIN_CHECK(!std::filesystem::is_directory(path), flag, " '", path,
                "' is a folder; give a file name");
  const auto parent = std::filesystem::path(path).parent_path();
  PPTRAIN_CHECK(parent.empty() || std::filesystem::is_directory(parent), flag, " '", path,
                "': folder '", parent.string(), "' does not exist");
}

void check_flags(const TrainOptions& options) {
  check_options(options.model);
  const int M = options.data.microbatches;
  PPTRAIN_CHECK(options.pp >= 1, "--pp must be >= 1, got ", options.pp);
  PPTRAIN_CHECK(options.dp >= 1, "--dp must be >= 1, got ", options.dp);
  PPTRAIN_CHECK(M >= 1, "--microbatches must be >= 1, got ", M);
  if (!options.dp_shares.empty()) {
    // (Their count and microbatches are resolve_run()'s to check.)
    int sum = 0;
    for (int share : parse_dp_shares(options.dp_shares, "--dp-shares")) sum += share;
    PPTRAIN_CHECK(sum == options.data.batch_size, "--dp-shares ", options.dp_shares, " sum to ",
                  sum, ", but --batch-size is ", options.data.batch_size,
                  " (each copy's samples of the batch)");
  } else if (options.dp == 1) {
    PPTRAIN_CHECK(options.data.batch_size >= 1 && options.data.batch_size % M == 0, "--batch-size ",
                  options.data.batch_size, " is not a positive multiple of --microbatches ", M);
  } else {
    PPTRAIN_CHECK(options.data.batch_size >= 1 && options.data.batch_size % (options.dp * M) == 0,
                  "--batch-size ", options.data.batch_size, " is not a positive multiple of --dp ",
                  options.dp, " x --microbatches ", M, " (each copy takes 1/", options.dp,
                  " of the batch in ", M, " microbatches)");
  }
  PPTRAIN_CHECK(options.steps >= 1, "--steps must be >= 1, got ", options.steps);
  PPTRAIN_CHECK(options.chunks >= 0,
                "--chunks must be >= 1 (or 0 for the schedule's default), got ", options.chunks);
  PPTRAIN_CHECK(options.comm_timeout_s >= 0, "--comm-timeout must be >= 1 s (0: the default), got ",
                options.comm_timeout_s);
  PPTRAIN_CHECK(options.stopped_timeout_s >= 1, "--stopped-timeout must be >= 1 s, got ",
                options.stopped_timeout_s);
  PPTRAIN_CHECK(options.threads >= 1, "--threads must be >= 1, got ", options.threads);
  PPTRAIN_CHECK(options.stages >= 0, "--stages must be >= 1, got ", options.stages);
  PPTRAIN_CHECK(options.stages == 0 || options.pp == 1,
                "--stages is for --pp 1 (the stages of one process); with --pp ", options.pp,
                " the schedule decides them");
  const int blocks = num_blocks(options.model);
  PPTRAIN_CHECK(options.pp <= blocks, "--pp ", options.pp, " is larger than the model's ", blocks,
                " blocks (--layers ", options.model.layers,
                "); every stage needs at least one block");
}

// TrainingPlan::microbatch_size: the copies' mean, at least 1.
int64_t mean_microbatch_size(const TrainOptions& options) {
  return std::max(options.data.batch_size / (options.dp * options.data.microbatches), 1);
}

StageLayerOptions stage_layer_options(const TrainOptions& options, bool may_profile) {
  StageLayerOptions layers;
  layers.model = options.model;
  layers.partition = options.partition;
  layers.stage_layers = options.stage_layers;
  layers.microbatch_size = mean_microbatch_size(options);
  layers.ranks = options.pp;
  layers.may_profile = may_profile;
  return layers;
}

// What zb-auto plans for and --memory-limit is checked with: --cost and --mem-w-ratio, or,
// without --cost, the per-stage times of a profile given as --partition FILE (read the same way
// by every rank).
CostModel planning_cost(const TrainOptions& options, bool may_profile) {
  CostModel cost = cost_model_from_flags(options.cost, options.mem_w_ratio);
  if (!options.cost.empty() || options.schedule != "zb-auto" || !options.schedule_file.empty() ||
      options.pp == 1 || !std::filesystem::is_regular_file(options.partition)) {
    return cost;  // (and `--partition time` is not timed twice)
  }
  const auto ranges = plan_stage_layers(stage_layer_options(options, may_profile), options.pp);
  if (const auto times = profiled_stage_times(options.partition, ranges)) {
    cost.stage_forward = times->forward;
    cost.stage_backward_input = times->backward_input;
    cost.stage_backward_weight = times->backward_weight;
  }
  return cost;
}

// The optimizer the flags ask for: --lr 0 is the optimizer's own default rate.
OptimizerOptions optimizer_options(const TrainOptions& options) {
  OptimizerOptions optimizer;
  optimizer.kind = options.optimizer;
  optimizer.lr = options.lr != 0 ? options.lr : options.optimizer == "adamw" ? 1e-3 : 0.05;
  optimizer.momentum = options.momentum;
  optimizer.warmup_steps = options.warmup_steps;
  optimizer.clip = options.clip;
  optimizer.post_validation = options.post_validation;
  optimizer.exact_rollback = options.exact_rollback;
  optimizer.skip_nonfinite = options.skip_nonfinite;
  return optimizer;
}

// The run the flags ask for (planner/run_request.h: every surface's one resolver). A partition
// file that replicates stages asks for PipeDream's round robin.
RunRequest run_request(const TrainOptions& options) {
  RunRequest run;
  run.optimizer = optimizer_options(options);
  run.zero = options.zero;
  run.recompute = options.recompute;
  // --tie-embeddings: the embedding's token table (the first stage) and the head (the last).
  if (options.model.tie_embeddings) run.ties = {{"embedding", {0, -1}}};
  run.schedule.names.tie = "--tie-embeddings";
  run.schedule.names.skips = "--model " + options.model.kind;
  ScheduleRequest& request = run.schedule;
  request.schedule = options.schedule;
  request.file = options.schedule_file;
  // A file's schedule is "imported" unless --plan names it.
  request.file_name =
      options.schedule_file_name.empty() ? std::string("imported") : options.schedule_file_name;
  request.pp = options.pp;
  request.microbatches = options.data.microbatches;
  request.chunks = options.chunks;
  request.steps = options.steps;
  // One rank has nothing to overlap: every schedule is its one-process reference, on --stages.
  request.one_process = options.pp == 1;
  request.stages = options.stages;
  request.family = options.family;
  request.dp = options.dp;
  if (!options.dp_shares.empty()) run.dp_shares = parse_dp_shares(options.dp_shares, "--dp-shares");
  request.memory_limit = options.memory_limit;
  request.solver = parse_solver(options.solver);
  request.time_limit_s = options.time_limit_s;
  request.solved_file = options.solved_schedule;
  if (!options.schedule_file.empty()) return run;
  request.replicas = partition_replicas(options.partition);
  if (!request.replicas.empty() || options.schedule == kRoundRobinSchedule) {
    PPTRAIN_CHECK(!request.replicas.empty(), "--schedule ", kRoundRobinSchedule,
                  " routes microbatches over replicated stages; give --partition FILE.json from ",
                  "`pptrain partition --method pipedream` whose stages have replicas");
    PPTRAIN_CHECK(options.schedule == "1f1b" || options.schedule == kRoundRobinSchedule,
                  "--partition '", options.partition, "' replicates stages, which runs ",
                  "PipeDream's round robin (", kRoundRobinSchedule, "), not --schedule ",
                  options.schedule);
    int workers = 0;
    for (int r : request.replicas) workers += r;
    PPTRAIN_CHECK(workers == options.pp, "--partition '", options.partition, "' places its ",
                  request.replicas.size(), " stages on ", workers,
                  " workers (their replicas), but --pp is ", options.pp);
    request.schedule = kRoundRobinSchedule;
    request.one_process = false;
  }
  return run;
}

// --save, --save-every, --keep, --load and --resume together; UserError naming the flags.
void check_checkpoint_flags(const TrainOptions& options, const TrainingPlan& plan) {
  PPTRAIN_CHECK(options.load_dir.empty() || options.resume_dir.empty(),
                "give --load (parameters only, from step 0) or --resume (parameters, optimizer "
                "state and step), not both");
  PPTRAIN_CHECK(options.save_every >= 0, "--save-every must be >= 0, got ", options.save_every);
  PPTRAIN_CHECK(options.keep >= 1, "--keep must be >= 1, got ", options.keep);
  PPTRAIN_CHECK(!options.save_dir.empty() || (options.save_every == 0 && options.keep == 1),
                "--save-every and --keep need --save DIR");
  PPTRAIN_CHECK(!options.sync_save || !options.save_dir.empty(), "--sync-save needs --save DIR");
  PPTRAIN_CHECK(options.max_restarts >= 0, "--max-restarts must be >= 0, got ",
                options.max_restarts);
  PPTRAIN_CHECK(options.max_restarts == 0 || !options.save_dir.empty(),
                "--max-restarts needs --save DIR: a restart continues from its newest checkpoint");
  PPTRAIN_CHECK(options.max_restarts == 0 || options.pp * options.dp > 1,
                "--max-restarts restarts the workers of --pp x --dp > 1 ranks; a one-process run "
                "has none");
  PPTRAIN_CHECK(options.resume_dir != "auto" || !options.save_dir.empty(),
                "--resume auto needs --save DIR: it continues from the newest checkpoint there");
  const std::string name = options.schedule_file.empty() ? options.schedule : "a schedule file";
  // avgpipe's copies differ between pulls, and the centre is not saved.
  const bool averages = options.schedule_file.empty() && find_schedule(name).averages_copies;
  PPTRAIN_CHECK(!averages || (options.save_every == 0 && options.resume_dir.empty()),
                options.save_every ? "--save-every" : "--resume", ": avgpipe's copies and their ",
                "centre are not all in a checkpoint (--save writes the first copy's weights)");
  // Under an asynchronous schedule the tied copies owe each other updates until the run ends.
  PPTRAIN_CHECK(
      !options.model.tie_embeddings || !plan.asynchronous() ||
          (options.save_every == 0 && options.resume_dir.empty() && options.max_restarts == 0),
      options.save_every     ? "--save-every"
      : options.max_restarts ? "--max-restarts"
                             : "--resume",
      ": ", name,
      " with --tie-embeddings saves only after the run's last step (the "
      "updates the tied copies owe each other are not in a checkpoint yet)");
  // An asynchronous run saved mid-way stops every rank after the same step, with microbatches in
  // flight: each rank's step must end before any work of the others' later steps.
  PPTRAIN_CHECK(options.save_every == 0 || !plan.asynchronous() ||
                    first_crossed_step(*plan.schedule, plan.microbatches()) < 0,
                "--save-every: in ", name, " a rank needs, before its part of a step ends, a ",
                "message another sends only after its own part; the ranks cannot all stop after ",
                "a step to save");
}

// The stage of `stage_layers` that holds `layer`.
int stage_holding(const std::vector<LayerRange>& stage_layers, int layer) {
  int s = 0;
  while (s + 1 < static_cast<int>(stage_layers.size()) && stage_layers[s].second < layer) ++s;
  return s;
}

}  // namespace

TrainingPlan plan_training(const TrainOptions& options, bool may_profile) {
  check_flags(options);
  const CostModel cost = planning_cost(options, may_profile);
  const RunRequest request = run_request(options);
  ResolvedRun run = resolve_run(request, cost);
  RequestedSchedule& made = run.schedule;
  const VersionRule rule = made.rule;
  PPTRAIN_CHECK(!options.compare_sim || !rule.asynchronous(), "--compare-sim: the simulator does ",
                "not model asynchronous schedules (", options.schedule, ") yet");
  const int blocks = num_blocks(options.model);
  // From the compute-only schedule (given()), which is not lowered: the skips may still change
  // it, and lowering it now would be lost.
  const int stages = made.validated.given().num_stages;
  PPTRAIN_CHECK(stages <= blocks, "schedule '", made.validated.given().name, "' has ", stages,
                " stages (--pp ", options.pp, " x ", made.validated.given().chunks(),
                " chunks) but the model has only ", blocks, " blocks (--layers ",
                options.model.layers, ")");
  // unet: each skip tensor whose two layers are on different stages goes straight across; those
  // that pass a stage get messages of their own in the schedule.
  std::vector<LayerRange> stage_layers =
      plan_stage_layers(stage_layer_options(options, may_profile), stages);
  std::vector<SkipConnection> skips;
  for (const LayerSkip& skip : layer_skips(options.model)) {
    const int from = stage_holding(stage_layers, skip.from_layer);
    const int to = stage_holding(stage_layers, skip.to_layer);
    if (from != to) skips.push_back({skip.name, from, to});
  }
  run = with_skips(std::move(run), std::move(skips), request.schedule.names);
  TrainingPlan plan(made.validated);
  const Schedule& schedule = *plan.schedule;
  plan.skips = run.skips;
  check_feasible_memory_limit(cost.stage_costs(schedule.num_stages, schedule.shares()),
                              options.memory_limit);
  // One process has no pipeline to cap (its reference run holds every microbatch).
  if (options.pp > 1 && options.memory_limit > 0) {
    check_peak_within_limit(simulate(plan.schedule, cost, rule, Record::kFigures),
                            options.memory_limit, schedule.name);
  }

  plan.weights = rule;
  plan.ties = run.ties;
  plan.family = options.family;
  // The averaging's family options, checked against the copies.
  if (made.averages_copies) copy_averaging(options.family, options.dp);
  plan.averages_copies = made.averages_copies;
  plan.model = options.model;
  plan.data = options.data;
  plan.copies = options.dp;
  plan.zero = run.zero;
  if (!equal_shares(request.dp_shares)) plan.dp_shares = request.dp_shares;
  plan.microbatch_size = mean_microbatch_size(options);
  // With --seq-len-range, 0: the library counts each step's own length.
  plan.tokens_per_sample = options.model.kind != "gpt"    ? 1
                           : options.data.min_seq_len > 0 ? 0
                                                          : options.model.seq_len;
  plan.stage_layers = std::move(stage_layers);
  plan.partition = options.partition;
  PPTRAIN_CHECK(options.replan == "off" || options.replan == "auto",
                "--replan must be off or auto, got '", options.replan, "'");
  plan.replan = options.replan == "auto" && options.pp > 1;
  PPTRAIN_CHECK(!plan.replan || (!plan.asynchronous() && !plan.schedule->replicated() &&
                                 plan.num_stages() == options.pp && options.dp == 1),
                "--replan auto moves layers between the ranks of one pipeline of one stage each, "
                "on a synchronous schedule; ",
                plan.schedule->name, " with --pp ", options.pp, " and --dp ", options.dp,
                " is not that");
  plan.steps = options.steps;
  plan.optimizer = *run.optimizer;
  plan.recompute = run.recompute;
  PPTRAIN_CHECK(options.weight_split == "deferred" || options.weight_split == "autograd",
                "--weight-split must be deferred or autograd, got '", options.weight_split, "'");
  plan.autograd_weight_split = options.weight_split == "autograd";
  plan.precision = parse_precision(options.precision, "--precision");
  plan.device = parse_device(options.device, "--device");
  PPTRAIN_CHECK(options.weight_casts == "microbatch" || options.weight_casts == "step",
                "--weight-casts must be microbatch or step, got '", options.weight_casts, "'");
  plan.casts_per_step = options.weight_casts == "step";
  PPTRAIN_CHECK(!plan.casts_per_step || plan.precision != Precision::kFp32,
                "--weight-casts step keeps each weight's cast to the compute dtype for the step, "
                "but --precision fp32 casts nothing: use --precision bf16 or fp16");
  PPTRAIN_CHECK(!plan.casts_per_step || !plan.asynchronous(),
                "--weight-casts step is for synchronous schedules; ", plan.schedule->name,
                " runs microbatches on weight versions that change within a step");
  // Before any worker starts, one line rather than one per rank, and without initialising CUDA
  // in a process that forks its workers: CUDA asked for where there is none. (Each worker's
  // decide_device checks the rest: the device itself, the precision on it.)
  if (plan.device == DeviceRequest::kCuda) require_cuda_present();
  PPTRAIN_CHECK(!scales_loss(plan.precision) || !plan.asynchronous(),
                "--precision fp16 skips the steps whose gradients overflow, on every rank at "
                "once, but ",
                plan.schedule->name, " steps its stages at different times: use --precision bf16");
  PPTRAIN_CHECK(!plan.autograd_weight_split || !plan.asynchronous(),
                "--weight-split autograd is for synchronous schedules; ", plan.schedule->name,
                " runs whole backwards on weight versions");
  plan.threads = options.threads;
  plan.load_dir = options.load_dir;
  plan.resume_dir = options.resume_dir;
  plan.save_dir = options.save_dir;
  plan.save_every = options.save_every;
  plan.keep = options.keep;
  plan.background_save = !options.sync_save;

  // Reads (and so checks) the data source before any worker starts.
  Dataset check_data(options.model, options.data);
  check_output_path(options.metrics_path, "--metrics");
  check_output_path(options.trace_path, "--trace file");
  check_output_path(options.svg_path, "--svg file");
  PPTRAIN_CHECK(options.save_workers.empty() || options.partition == kWorkersPartition,
                "--save-workers writes what --partition workers measures; the run has --partition ",
                options.partition);
  check_output_path(options.save_workers, "--save-workers file");
  PPTRAIN_CHECK(options.worker_memory_limits.empty() || options.partition == kWorkersPartition ||
                    options.replan == "auto",
                "--worker-memory-limits are the limits --partition workers and --replan auto "
                "cut for; the run has --partition ",
                options.partition, " and --replan ", options.replan);
  if (!options.placement.empty()) {
    plan.placement = parse_placement(options.placement, plan.world_size(), "--placement");
    if (is_identity(plan.placement)) plan.placement.clear();
  }
  if (!options.worker_memory_limits.empty()) {
    parse_worker_memory_limits(options.worker_memory_limits, plan.world_size());
  }
  check_save_path(options.save_dir);
  check_checkpoint_flags(options, plan);
  if (!options.load_dir.empty()) check_checkpoint(options.load_dir, options.model, "--load");
  if (options.resume_dir == "auto") {
    plan.finished = holds_finished_run(options.save_dir, plan);
    if (plan.finished) return plan;
    plan.resume_dir = newest_resumable(options.save_dir, plan, &plan.resume_skipped);
  }
  if (!plan.resume_dir.empty()) {
    plan.first_step = check_resume(plan.resume_dir, plan);
    plan.resumed_precision = checkpoint_precision(plan.resume_dir);
  }
  return plan;
}

void apply_plan_file(const PlanFile& plan, const PlanFlagsGiven& given, TrainOptions& options) {
  const std::string source = "--plan " + plan.path;
  const auto agree = [&](bool flag_given, const char* flag, const auto& value,
                         const auto& planned) {
    PPTRAIN_CHECK(!flag_given || value == planned, flag, " ", value, " contradicts ", source,
                  ", which plans ", planned, "; leave ", flag, " out");
  };
  agree(given.pp, "--pp", options.pp, plan.workers);
  agree(given.microbatches, "--microbatches", options.data.microbatches, plan.microbatches);
  agree(given.batch_size, "--batch-size", options.data.batch_size, plan.batch_size);
  agree(given.schedule, "--schedule", options.schedule, plan.schedule);
  agree(given.schedule_file, "--schedule-file", options.schedule_file, plan.schedule_file);
  agree(given.chunks && options.chunks != 0, "--chunks", options.chunks, plan.chunks);
  agree(given.partition, "--partition", options.partition, plan.partition_file);
  const std::string layers = format_stage_layers(plan.stage_layers);
  agree(given.stage_layers, "--stage-layers", options.stage_layers, layers);
  PPTRAIN_CHECK(!options.recompute || plan.recompute, "--recompute contradicts ", source,
                ", which plans without recomputation; leave --recompute out");
  agree(given.dp, "--dp", options.dp, plan.dp);
  // A plan's memory holds at its own precision only (at fp32 a bf16 plan's activations double).
  agree(given.precision, "--precision", options.precision,
        std::string(precision_name(plan.precision)));
  options.precision = precision_name(plan.precision);
  options.pp = plan.workers;
  options.dp = plan.dp;
  options.data.microbatches = plan.microbatches;
  options.data.batch_size = plan.batch_size;
  options.schedule = plan.schedule;
  options.schedule_file = plan.schedule_file;
  options.schedule_file_name = plan.schedule;
  options.chunks = plan.chunks;
  options.partition = plan.partition_file;
  options.stage_layers = layers;
  options.recompute = plan.recompute;
  if (!plan.placement.empty()) {
    const std::string placement = format_placement(plan.placement);
    agree(!options.placement.empty(), "--placement", options.placement, placement);
    options.placement = placement;
  }
  if (!plan.dp_shares.empty()) {
    const std::string shares = format_dp_shares(plan.dp_shares);
    agree(!options.dp_shares.empty(), "--dp-shares", options.dp_shares, shares);
    options.dp_shares = shares;
  }
}

}  // namespace pptrain
