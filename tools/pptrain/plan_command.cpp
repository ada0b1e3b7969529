// `pptrain plan`: the joint planner. Searches partition x schedule x microbatch count x
// recomputation for a profiled model on P workers under a memory limit (pptrain/planner/),
// prints the ranked candidates and writes the winner's plan.json, partition, schedule CSV and
// simulated timeline into --out.
//
//   pptrain plan --profile gpt.json --workers 4 --memory-limit 2e9 --batch 32 --out plan
//   pptrain train --plan plan/plan.json --model gpt ...
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/partition/profile.h"
#include "pptrain/partition/workers.h"
#include "pptrain/planner/plan_file.h"
#include "pptrain/planner/planner.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

struct PlanArgs {
  std::string profile;
  int workers = 0;
  int dp = 1;
  double memory_limit = -1;  // required
  double memory_margin = 0.05;
  int batch = 0;
  int profile_microbatch_size = 0;
  std::string microbatches;
  std::string partitions;
  std::string schedules;
  std::string recompute = "both";
  std::string optimizer = "adamw";
  double mem_w_ratio = 0.5;
  double w_fraction = 0;
  bool w_fraction_given = false;
  int max_chunks = 4;
  int top = 10;
  int jobs = 0;
  std::string out;
  std::string workers_profile;
  bool json = false;
  bool explain = false;
  std::string precision = "fp32";
};

int parse_count(const std::string& text, const std::string& flag_value) {
  const std::optional<int> value = positive_int(text);
  PPTRAIN_CHECK(value.has_value(),
                "--microbatches must be a list (4,8,16) or a range (4-32) of counts >= 1, got '",
                flag_value, "'");
  return *value;
}

// "4,8,16" is a list; "4-32" every divisor of the batch from 4 to 32.
void parse_microbatches(const std::string& text, PlannerOptions& options) {
  if (text.empty()) return;
  const size_t dash = text.find('-');
  if (dash != std::string::npos) {
    options.min_microbatches = parse_count(text.substr(0, dash), text);
    options.max_microbatches = parse_count(text.substr(dash + 1), text);
    return;
  }
  for (const std::string& item : split_commas(text)) {
    options.microbatches.push_back(parse_count(item, text));
  }
}

PlannerOptions options_from(const PlanArgs& args) {
  PPTRAIN_CHECK(args.memory_limit >= 0,
                "--memory-limit must be >= 0 bytes per rank (0: none), got ", args.memory_limit);
  PPTRAIN_CHECK(args.workers >= 1, "--workers must be >= 1, got ", args.workers);
  PPTRAIN_CHECK(args.batch >= 0, "--batch must be >= 1 samples, got ", args.batch);
  PPTRAIN_CHECK(args.dp >= 1, "--dp must be >= 1, got ", args.dp);
  PPTRAIN_CHECK(args.batch % args.dp == 0, "--batch ", args.batch, " is not a multiple of --dp ",
                args.dp, " (each copy is planned on its 1/", args.dp, " of the batch)");
  PlannerOptions options;
  options.workers = args.workers;
  options.copies = args.dp;
  options.memory_limit_bytes = args.memory_limit;
  options.memory_margin = args.memory_margin;
  options.batch_size = args.batch;
  options.profile_microbatch_size = args.profile_microbatch_size;
  parse_microbatches(args.microbatches, options);
  options.partitions = split_commas(args.partitions);
  options.schedules = split_commas(args.schedules);
  options.recompute = recompute_choices(args.recompute);
  options.optimizer_state_factor = optimizer_state_factor(args.optimizer);
  options.mem_w_ratio = args.mem_w_ratio;
  options.w_fraction = args.w_fraction;
  options.max_chunks = args.max_chunks;
  options.keep = args.top;
  options.jobs = args.jobs;
  if (!args.workers_profile.empty()) {
    const WorkersProfile workers = read_workers_profile(args.workers_profile);
    check_workers_count(workers, args.workers * args.dp,
                        args.dp == 1
                            ? detail::concat("--workers ", args.workers)
                            : detail::concat("--workers ", args.workers, " x --dp ", args.dp));
    if (!workers.all_equal()) {  // equal workers plan as without the file
      options.rank_speeds = workers.speeds();
      options.rank_memory_limits = workers.memory_limits_bytes();
    }
  }
  check_planner_options(options);
  return options;
}

void run_plan_command(const PlanArgs& args) {
  const PlannerOptions options = options_from(args);
  const Profile measured = read_profile(args.profile);
  const Precision precision = parse_precision(args.precision, "--precision");
  if (measured.precision != precision) {
    std::fprintf(stderr,
                 "pptrain: plan: %s was measured at %s: its activation bytes are taken at %s's "
                 "(its times as measured: `pptrain profile --precision %s` measures both)\n",
                 args.profile.c_str(), precision_name(measured.precision),
                 precision_name(precision), precision_name(precision));
  }
  const Profile profile = at_precision(measured, precision);
  if (args.w_fraction_given) check_w_fraction_applies(profile, args.w_fraction);

  const auto start = std::chrono::steady_clock::now();
  const PlanSearch search = search_plans(profile, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const PlanFiles files;
  const std::string json = write_plan_folder(args.out, profile, options, search, files);

  if (args.json) {
    std::fputs(json.c_str(), stdout);
    return;
  }
  std::fputs(plan_table_text(profile, options, search, seconds).c_str(), stdout);
  if (args.explain) {
    Candidate winner = search.ranked.front();
    const Evaluation evaluation = evaluate(profile, options, winner);
    std::printf("\nthe winner, by the memory model:\n%s", format_memory(evaluation.memory).c_str());
  }
  std::printf("\nwrote %s: plan.json, %s, %s, %s\n", args.out.c_str(), files.partition.c_str(),
              files.schedule.c_str(), files.svg.c_str());
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* command = app.add_subcommand(
      "plan", "Search partition x schedule x microbatches x recomputation for a memory limit");
  add_profile_option(command, args->profile);
  command->add_option("--workers", args->workers, "Pipeline workers (P)")->required();
  command
      ->add_option("--memory-limit", args->memory_limit,
                   "Bytes per worker: weights, gradients, optimizer state, the batch, peak "
                   "activations, messages in flight and working memory (0: none)")
      ->required();
  command
      ->add_option("--dp", args->dp,
                   "Data-parallel copies of the pipeline (D), each on its own P workers: "
                   "--batch is then their batch together, and on unequal workers (a "
                   "--workers-profile of P x D) each copy gets a share for its pace")
      ->capture_default_str();
  command
      ->add_option("--precision", args->precision,
                   "What the run computes in: fp32, bf16 or fp16; a profile measured at another "
                   "precision has its activation bytes scaled to it")
      ->capture_default_str();
  command->add_option("--workers-profile", args->workers_profile,
                      "The workers' relative speeds and memory limits (pptrain-workers-1 JSON, "
                      "as `pptrain train --partition workers` measures them): a slower rank gets "
                      "less; a rank's own limit replaces --memory-limit there");
  command
      ->add_option("--memory-margin", args->memory_margin,
                   "Share of the limit the plans leave free, for the memory model's error and the "
                   "allocator's slack")
      ->capture_default_str();
  command
      ->add_option("--out", args->out,
                   "Folder for plan.json, partition.json, schedule.csv and timeline.svg")
      ->required();
  command->add_option("--batch", args->batch,
                      "Samples per step (default: 4P microbatches of the profiled size)");
  command->add_option("--profile-microbatch-size", args->profile_microbatch_size,
                      "Samples the profile's figures are for (default: the profile's own "
                      "settings.microbatch_size, else 1); times and activations scale with the "
                      "microbatch size");
  command->add_option("--microbatches", args->microbatches,
                      "Microbatch counts M: a list (4,8,16) or a range (4-32) of divisors of the "
                      "batch (default: every divisor up to 1024)");
  command->add_option("--partitions", args->partitions,
                      "Partition methods to try, e.g. uniform,time (default: uniform, params, "
                      "time, pipedream)");
  command->add_option("--schedules", args->schedules,
                      "Schedules to try, e.g. 1f1b,zb-v (default: every synchronous one)");
  command->add_option("--recompute", args->recompute, "both, on or off")->capture_default_str();
  command
      ->add_option("--optimizer", args->optimizer,
                   "Optimizer state counted per parameter byte: adamw (2), sgd (1)")
      ->capture_default_str();
  command
      ->add_option("--mem-w-ratio", args->mem_w_ratio,
                   "Share r of a stage's activations W keeps after I")
      ->capture_default_str();
  CLI::Option* w_fraction =
      command
          ->add_option(
              "--w-fraction", args->w_fraction,
              "For a profile with one backward time per layer (PipeDream's graph.txt): the "
              "share of it W takes, I the rest (0: all in I, every W free; the zero-bubble "
              "paper's I = W is 0.5)")
          ->capture_default_str();
  command
      ->add_option("--max-chunks", args->max_chunks,
                   "Stages per worker tried for schedules that take several")
      ->capture_default_str();
  command->add_option("--top", args->top, "Candidates shown and kept in plan.json")
      ->capture_default_str();
  command
      ->add_option("--jobs", args->jobs,
                   "Threads the search runs on (0: the machine's cores); the plan is the same "
                   "for any number")
      ->capture_default_str();
  command->add_flag("--json", args->json, "Print plan.json instead of the table");
  command->add_flag("--explain", args->explain,
                    "Also print the winner's predicted memory of each rank in parts");
  command->footer(
      "Asynchronous schedules (pipedream, 2bw, pipemare, ...) are not searched: they train with "
      "stale weights, so their step time is not comparable with synchronous training. "
      "pptrain train --plan DIR/plan.json runs the winner.");
  command->callback([args, w_fraction] {
    args->w_fraction_given = w_fraction->count() > 0;
    run_plan_command(*args);
  });
}

}  // namespace pptrain::cli
