// `pptrain train`: pipeline-parallel training of a gpt or mlp model following a schedule.
//
//   pptrain train --model gpt --layers 8 --pp 2 --schedule 1f1b --microbatches 8
//                 --batch-size 8 --steps 10 --metrics m.jsonl --trace last_step.json --save ckpt
//
// Without RANK in the environment and with --pp > 1, this process checks the arguments, then
// starts P workers (itself forked, one per rank, each parsing the command line again) and
// supervises them; with RANK set (by us or by torchrun) it runs as that rank. --pp 1 trains in
// this process: the reference every pipelined run must match.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pptrain/api/trainer.h"
#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/plan.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

namespace {

// The plan's compute order (no SEND/RECV, no REDUCE_GRAD: each worker adds them again) in a
// new temporary CSV file; its path.
std::string solved_schedule_file(const TrainingPlan& plan) {
  std::string path = (std::filesystem::temp_directory_path() / "pptrain-solved-XXXXXX").string();
  const int fd = mkstemp(path.data());
  PPTRAIN_CHECK(fd >= 0, "cannot create a temporary file for the solved schedule in ",
                std::filesystem::temp_directory_path().string());
  close(fd);
  write_text_file(path, to_csv(remove_grad_reductions(strip_comms(*plan.schedule))),
                  "solved schedule file");
  return path;
}

// `args` without `option` and its value ("--resume DIR" or "--resume=DIR").
std::vector<std::string> without_option(const std::vector<std::string>& args,
                                        const std::string& option) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == option) {
      ++i;  // and its value
    } else if (args[i].rfind(option + "=", 0) != 0) {
      out.push_back(args[i]);
    }
  }
  return out;
}

void run_train(const TrainOptions& options) {
  const bool worker = running_as_worker();
  const int world = options.pp * options.dp;
  // A launcher computes on one thread: its workers are forks of it, and a fork of a process in
  // which OpenMP ran a team of several threads hangs in its own first parallel region (the team's
  // threads are not in the child). Each worker then sets its own (--threads).
  if (!worker && world > 1) set_compute_threads(1);
  // Every user error surfaces here, before any worker starts. A rank started by torchrun cannot
  // time the layers the way the others would, so it does not profile (plan.h).
  const TrainingPlan plan = plan_training(options, /*may_profile=*/!worker || world == 1);
  if (plan.finished) {
    if (!worker) {
      std::fprintf(stderr,
                   "pptrain: --resume auto: %s already holds step %d of %d: the run is complete\n",
                   options.save_dir.c_str(), plan.steps, plan.steps);
    }
    return;
  }
  if (options.resume_dir == "auto" && !worker) {
    for (const std::string& why : plan.resume_skipped) {
      std::fprintf(stderr, "pptrain: --resume auto: passing over a checkpoint: %s\n", why.c_str());
    }
    std::fprintf(
        stderr, "pptrain: --resume auto: %s\n",
        plan.resume_dir.empty()
            ? ("no checkpoint to continue in " + options.save_dir + ": starting at step 0").c_str()
            : ("continuing from step " + std::to_string(plan.first_step) + " of " + plan.resume_dir)
                  .c_str());
  }
  if (!worker && world > 1) {
    LaunchOptions launch;
    launch.workers = world;
    launch.stopped_timeout = std::chrono::seconds(options.stopped_timeout_s);
    // The workers are this process forked, not executed again: LibTorch is loaded once, here.
    launch.run_in_child = run_runtime_cli;
    launch.args = own_arguments();  // the workers get this command line again...
    if (options.stage_layers.empty()) {
      // ...with the ranges resolved here, so that every rank holds the same layers.
      launch.args.insert(launch.args.end(),
                         {"--stage-layers", format_stage_layers(plan.stage_layers)});
    }
    // --solver ilp: every worker runs the order solved here (a time limit could end differently
    // in each process), which it reads from a file of ours.
    std::string solved;
    if (options.pp > 1 && options.solved_schedule.empty() &&
        parse_solver(options.solver) == ScheduleSolver::kIlp) {
      solved = solved_schedule_file(plan);
      launch.args.insert(launch.args.end(), {"--solved-schedule", solved});
    }
    // The workers continue the checkpoint resolved here (--resume auto, or after a restart).
    const std::vector<std::string> args = without_option(launch.args, "--resume");
    const auto resume_from = [&](const std::string& dir) {
      launch.args = args;
      if (!dir.empty()) launch.args.insert(launch.args.end(), {"--resume", dir});
    };
    resume_from(plan.resume_dir);
    // --max-restarts: a failed run starts again from the newest whole checkpoint.
    const LaunchResult result = launch_with_restarts(
        launch, options.max_restarts, [&](int restart, const LaunchResult& failed) {
          // Killed after its last save: nothing is left to run.
          if (holds_finished_run(options.save_dir, plan)) {
            std::fprintf(stderr,
                         "pptrain: no restart after: %s; %s already holds the run's last step "
                         "(%d): the run is complete\n",
                         failed.message.c_str(), options.save_dir.c_str(), plan.steps);
            std::fflush(stderr);
            return false;
          }
          std::vector<std::string> skipped;
          const std::string dir = newest_resumable(options.save_dir, plan, &skipped);
          for (const std::string& why : skipped) {
            std::fprintf(stderr, "pptrain: restart %d/%d: passing over a checkpoint: %s\n", restart,
                         options.max_restarts, why.c_str());
          }
          const int step = dir.empty() ? 0 : check_resume(dir, plan);
          std::fprintf(stderr, "pptrain: restart %d/%d after: %s; resuming from step %d%s\n",
                       restart, options.max_restarts, failed.message.c_str(), step,
                       dir.empty() ? " (no checkpoint yet)" : (" of " + dir).c_str());
          std::fflush(stderr);
          resume_from(dir);
          return true;
        });
    if (!solved.empty()) std::remove(solved.c_str());
    if (result.exit_code != 0) {
      std::fprintf(stderr, "pptrain: error: %s\n",
                   failure_text(result, options.max_restarts).c_str());
      std::fflush(stderr);
      std::exit(result.exit_code);
    }
    return;
  }
  std::unique_ptr<Transport> transport;
  if (world == 1) {
    transport = std::move(make_loopback_transports(1).front());
  } else {
    TransportOptions transport_options = TransportOptions::from_env();
    if (options.comm_timeout_s > 0) {
      transport_options.timeout = std::chrono::seconds(options.comm_timeout_s);
    }
    PPTRAIN_CHECK(transport_options.world_size == world,
                  "WORLD_SIZE=", transport_options.world_size, " does not match --pp ", options.pp,
                  " x --dp ", options.dp);
    transport = connect_transport(transport_options);
  }
  const auto observers = make_observers(options);
  train(plan, *transport, raw_pointers(observers));
}

// "MIN:MAX" with 1 <= MIN <= MAX.
std::pair<int64_t, int64_t> parse_seq_len_range(const std::string& text) {
  const size_t colon = text.find(':');
  const auto number = [](const std::string& part) -> int64_t {
    if (part.empty() || part.size() > 9 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return -1;
    return std::stoll(part);
  };
  const int64_t min = colon == std::string::npos ? -1 : number(text.substr(0, colon));
  const int64_t max = colon == std::string::npos ? -1 : number(text.substr(colon + 1));
  PPTRAIN_CHECK(min >= 1 && max >= min, "--seq-len-range '", text,
                "' is not MIN:MAX with whole numbers 1 <= MIN <= MAX");
  return {min, max};
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* cmd =
      app.add_subcommand("train", "Train a model split into a pipeline across worker processes");
  TrainOptions& o = *options;
  cmd->add_option("--model", o.model.kind, "Model: gpt, mlp or unet")->required();
  cmd->add_option("--layers", o.model.layers, "Transformer / MLP blocks")->capture_default_str();
  cmd->add_option("--d-model", o.model.d_model, "Model width")->capture_default_str();
  cmd->add_option("--heads", o.model.heads, "Attention heads (gpt)")->capture_default_str();
  auto* seq_len = cmd->add_option("--seq-len", o.model.seq_len, "Tokens per sample (gpt)")
                      ->capture_default_str();
  cmd->add_flag("--tie-embeddings", o.model.tie_embeddings,
                "gpt: the head's output weight is the embedding's token table (each stage keeps a "
                "copy; their gradients are summed before every step)");
  auto seq_len_range = std::make_shared<std::string>();
  cmd->add_option("--seq-len-range", *seq_len_range,
                  "MIN:MAX: each batch has its own sequence length, drawn from MIN..MAX by the "
                  "seed and the step (gpt; the position table has MAX rows)");
  cmd->add_option(
         "--data", o.data.source,
         "Training text file, 'synthetic', or 'default' (a text under /usr/share/common-licenses)")
      ->capture_default_str();
  auto* pp =
      cmd->add_option("--pp", o.pp, "Pipeline ranks (worker processes per copy of the pipeline)");
  cmd->add_option("--dp", o.dp,
                  "Copies of the pipeline (data parallelism): D x P workers, each copy trains on "
                  "1/D of --batch-size and the copies of a stage average their gradients");
  cmd->add_option("--zero", o.zero,
                  "1: shard the optimizer state over the --dp copies (each keeps and steps about "
                  "1/D of the layers' state, then shares the new weights); 0: no sharding");
  auto* chunks =
      cmd->add_option("--chunks", o.chunks,
                      "Stages per rank (interleaved-1f1b, zb-v); 0 = the schedule's default")
          ->capture_default_str();
  auto* name = cmd->add_option("--schedule", o.schedule, "Schedule (see the list below)")
                   ->capture_default_str();
  auto* file =
      cmd->add_option("--schedule-file", o.schedule_file, "Schedule CSV (one row per rank)");
  name->excludes(file);
  cmd->add_option("--cost", o.cost,
                  "Cost model zb-auto plans for: F, I, W times of one rank's share for one "
                  "microbatch and the comm latency (as `pptrain schedule --cost`); default: the "
                  "per-stage times of --partition when it is a profile, else F=1,I=1,W=1,comm=0");
  cmd->add_option("--memory-limit", o.memory_limit,
                  "Cap on every rank's peak activations, in units of one microbatch's forward "
                  "activations on a stage (P: 1F1B's memory); zb-auto plans under it, other "
                  "schedules are refused above it; 0: none")
      ->capture_default_str();
  cmd->add_option("--solver", o.solver,
                  "How zb-auto orders the actions: heuristic or ilp (CBC, warm-started from the "
                  "heuristic, never worse; solved once by the launcher)")
      ->capture_default_str();
  auto* time_limit = cmd->add_option("--time-limit", o.time_limit_s,
                                     "--solver ilp: seconds CBC may search (wall time)")
                         ->capture_default_str();
  // What the launcher passes its workers with --solver ilp.
  cmd->add_option("--solved-schedule", o.solved_schedule,
                  "The order the launcher solved (CSV; --solver ilp)");
  cmd->add_option("--mem-w-ratio", o.mem_w_ratio,
                  "Share r of a microbatch's activations that W still needs after I")
      ->capture_default_str();
  auto* partition =
      cmd->add_option(
             "--partition", o.partition,
             "Layers per stage: uniform, params (balanced parameter bytes), time (profiles "
             "this machine first; under torchrun give a profile instead), or FILE.json (from "
             "`pptrain partition --json`, or a profile from `pptrain profile`, cut with time)")
          ->capture_default_str();
  // What the launcher passes its workers: the ranges it resolved from --partition.
  auto* stage_layers =
      cmd->add_option("--stage-layers", o.stage_layers, "Resolved stage layer ranges, e.g. 0-2,3-5")
          ->group("");
  auto* microbatches =
      cmd->add_option("--microbatches", o.data.microbatches, "Microbatches per step (M)");
  auto* batch_size =
      cmd->add_option("--batch-size", o.data.batch_size, "Samples per step, over all microbatches");
  auto plan_path = std::make_shared<std::string>();
  cmd->add_option("--plan", *plan_path,
                  "plan.json of `pptrain plan`: sets --pp, --microbatches, --batch-size, the "
                  "schedule, the stage layers and --recompute (a flag contradicting it is an "
                  "error)");
  cmd->add_option("--steps", o.steps, "Optimizer steps")->required();
  cmd->add_option("--lr", o.lr, "Learning rate; 0 = 0.05 for sgd, 1e-3 for adamw")
      ->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "sgd (with --momentum) or adamw (weight decay 0.01)")
      ->capture_default_str();
  cmd->add_option("--momentum", o.momentum, "sgd's momentum")->capture_default_str();
  cmd->add_option("--warmup-steps", o.warmup_steps,
                  "Grow the learning rate linearly from lr/N to lr over the first N steps "
                  "(asynchronous schedules: by the step a microbatch belongs to); 0 = none")
      ->capture_default_str();
  cmd->add_option("--clip", o.clip,
                  "Max global gradient norm; 0 = off (asynchronous schedules: each stage's own)")
      ->capture_default_str();
  cmd->add_option("--stages", o.stages,
                  "With --pp 1: run the model as this many stages in one process, the reference "
                  "an asynchronous schedule on that many ranks must match")
      ->capture_default_str();
  cmd->add_flag("--vertical-sync", o.vertical_sync,
                "pipedream: every stage uses the weight version a microbatch entered with");
  cmd->add_flag("--no-lr-reschedule", o.no_lr_reschedule,
                "pipemare: every stage at --lr from the first step (default: divided by the "
                "stage's delay, annealed to --lr over --pipemare-warmup steps)");
  cmd->add_flag("--no-discrepancy-correction", o.no_discrepancy_correction,
                "pipemare: the backward on the newest weights as they are (default: moved back "
                "by the recent updates towards the weights its forward saw)");
  cmd->add_option("--pipemare-warmup", o.pipemare_warmup,
                  "pipemare: steps over which the rescheduled rate reaches --lr (default 100)");
  cmd->add_option("--pipemare-decay", o.pipemare_decay,
                  "pipemare: D in [0, 1) of the correction's running average, which keeps "
                  "D^(1/delay) of its old value per step (default 0.1)");
  cmd->add_option("--update-interval", o.update_interval,
                  "ampnet: each stage steps its optimizer after every U backwards (default 1)");
  cmd->add_option("--avg-interval", o.avg_interval,
                  "avgpipe: steps between two elastic averagings of the --dp copies (default 4)");
  cmd->add_option("--avg-alpha", o.avg_alpha,
                  "avgpipe: how far each copy and the centre move towards each other, in "
                  "(0, 2/D) (default 0.9/D)");
  cmd->add_option("--seed", o.model.seed, "Seed of the weights and the data")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "Compute threads per process")->capture_default_str();
  cmd->add_option("--comm-timeout", o.comm_timeout_s,
                  "Seconds a rank waits for a peer's message or a collective before it stops, "
                  "naming the peer and the operation (default: PPTRAIN_COMM_TIMEOUT_S, else 60)");
  cmd->add_option("--stopped-timeout", o.stopped_timeout_s,
                  "Seconds a worker may stay stopped (SIGSTOP) before the launcher stops the run, "
                  "naming it")
      ->capture_default_str();
  cmd->add_option("--metrics", o.metrics_path, "Write one JSON line of metrics per step");
  cmd->add_option("--trace", o.trace_path, "Write the last step's measured Chrome trace (JSON)");
  cmd->add_option("--svg", o.svg_path, "Write the last step's measured timeline (SVG)");
  cmd->add_option("--save", o.save_dir,
                  "Write a checkpoint folder after the last step: parameters, optimizer state, "
                  "step (replaced whole, never half-written)");
  cmd->add_option("--save-every", o.save_every,
                  "Also write the checkpoint after every N steps (synchronous schedules)");
  cmd->add_option("--keep", o.keep,
                  "Checkpoints to keep: --save DIR and the K-1 before it as DIR.step-<step>")
      ->capture_default_str();
  cmd->add_flag("--sync-save", o.sync_save,
                "Write checkpoints in the step loop; by default a save copies each rank's state "
                "to memory and a thread writes it while training goes on");
  cmd->add_option("--load", o.load_dir,
                  "Start from the parameters of a checkpoint (step 0, a fresh optimizer)");
  cmd->add_option("--resume", o.resume_dir,
                  "Continue the run that saved a checkpoint: its parameters, optimizer state and "
                  "step, up to --steps (counted from the run's start); any --pp. 'auto': the "
                  "newest whole checkpoint in --save DIR (or DIR.step-<k>), or a fresh start");
  cmd->add_option("--max-restarts", o.max_restarts,
                  "When a worker dies, hangs or the run fails (not on bad input, exit 2), stop "
                  "every rank and start again from the newest whole checkpoint of --save DIR, at "
                  "most N times")
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "No per-step lines");
  cmd->add_flag("--recompute", o.recompute,
                "Keep only each stage's input between forward and backward; rerun the forward "
                "before the backward (less activation memory, one more forward)");
  cmd->add_option("--weight-split", o.weight_split,
                  "How zero-bubble schedules split a backward into I and W: deferred (the "
                  "layers' own deferred weight gradients) or autograd (any module's way: input "
                  "gradient first, then the weights' from the kept graph)")
      ->capture_default_str();
  cmd->add_flag("--post-validation", o.post_validation,
                "No all-reduce before the optimizer step: ranks step on the partial gradient "
                "norm passed along the pipeline and take the step back when the full norm says "
                "clip or skip (the zero-bubble paper's post-validation; same results)");
  cmd->add_flag("--exact-rollback", o.exact_rollback,
                "With --post-validation: undo a step from saved copies (bit for bit) instead of "
                "inverting the optimizer's update");
  cmd->add_flag("--skip-nonfinite", o.skip_nonfinite,
                "Skip the optimizer step of a step whose loss or gradients are not finite "
                "(default: stop the run, exit status 1, naming the step)");
  cmd->add_flag("--compare-sim", o.compare_sim,
                "After training, simulate the schedule with this run's measured per-stage times "
                "and print predicted vs measured (with --svg: both timelines)");
  cmd->footer("Schedules (P ranks, M microbatches, V chunks per rank):\n" + schedule_help_text());
  cmd->callback([=] {
    TrainOptions o = *options;
    PPTRAIN_CHECK(time_limit->count() == 0 || o.solver == "ilp",
                  "--time-limit applies to --solver ilp only (the heuristic takes milliseconds)");
    if (!plan_path->empty()) {
      PlanFlagsGiven given;
      given.pp = pp->count() > 0;
      given.microbatches = microbatches->count() > 0;
      given.batch_size = batch_size->count() > 0;
      given.schedule = name->count() > 0;
      given.schedule_file = file->count() > 0;
      given.chunks = chunks->count() > 0;
      given.partition = partition->count() > 0;
      given.stage_layers = stage_layers->count() > 0;
      apply_plan_file(read_plan_file(*plan_path), given, o);
    } else {
      for (const CLI::Option* flag : {pp, microbatches, batch_size}) {
        PPTRAIN_CHECK(flag->count() > 0, flag->get_name(), " is required (or --plan FILE)");
      }
    }
    if (!seq_len_range->empty()) {
      const auto [min, max] = parse_seq_len_range(*seq_len_range);
      PPTRAIN_CHECK(seq_len->count() == 0 || o.model.seq_len == max, "--seq-len ", o.model.seq_len,
                    " and --seq-len-range ", *seq_len_range, " disagree: give one of them");
      o.model.seq_len = max;
      o.data.min_seq_len = min;
    }
    o.data.seed = o.model.seed;
    run_train(o);
  });
}

}  // namespace pptrain::cli
