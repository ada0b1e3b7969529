// `pptrain schedule`: generate (or import) a schedule, lower and validate it, simulate it under a
// cost model, print a summary (or --json), and optionally export CSV, an SVG picture, a Chrome
// trace or the text grid.
//
//   pptrain schedule --schedule 1f1b --pp 4 --microbatches 8 --grid --svg 1f1b.svg
//   pptrain schedule --import mine.csv --cost F=1,I=1,W=1,comm=0.1 --json
//   pptrain schedule --schedule zb-v --pp 4 --microbatches 8 --dp 2 --cost reduce=3 --svg v.svg
//   pptrain schedule --schedule 1f1b-rr --replicas 3,1 --microbatches 6 --grid
//   pptrain schedule --list     # the registry as a markdown table (docs/CLI.md's)
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/malloc.h"
#include "pptrain/generators/registry.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/schedule/grid.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

struct ScheduleArgs {
  std::string schedule;
  int pp = 0;
  int microbatches = 0;
  int chunks = 0;
  std::string cost = "F=1,I=1,W=1,comm=0";
  double memory_limit = 0;   // cap on every rank's peak (memory-model units); 0: none
  double mem_w_ratio = 0.5;  // r: share of the activations W still needs after I
  std::string import_path;
  std::string export_path;
  bool with_comms = false;
  std::string svg_path;
  std::string trace_path;
  bool grid = false;
  bool json = false;
  bool list = false;
  int steps = 3;             // an asynchronous schedule: steps of M microbatches, no flush
  FamilyValues family;       // the options of the schedule's family that were given
  int dp = 1;                // D: data-parallel copies of the pipeline; > 1 adds REDUCE_GRADs
  std::string profile;       // a `pptrain profile` file: the costs, in ms, instead of --cost
  std::string stage_layers;  // with --profile: the stages' layers; empty: the time partition
  std::string replicas;      // 1f1b-rr: replicas of each stage, "3,1"
  double cores = 0;          // cores of the host, shared by all D x P ranks; 0: one each
  std::string solver = "heuristic";  // zb-auto: heuristic or ilp
  double time_limit_s = 60;          // --solver ilp: CBC's wall-time limit, seconds
  std::vector<std::string> skips;    // --skip FROM:TO, repeatable
  // Which of the numeric flags the user gave (an imported schedule must agree with them).
  bool pp_given = false, microbatches_given = false, chunks_given = false, time_limit_given = false;
};

// "3,1" -> {3, 1}; a one-line UserError naming the flag for anything else.
std::vector<int> parse_replicas(const std::string& text) {
  std::vector<int> replicas;
  // "" is one empty piece, refused like any other.
  for (const std::string& piece :
       text.empty() ? std::vector<std::string>{""} : split_commas(text)) {
    const std::optional<int> value = positive_int(piece);
    PPTRAIN_CHECK(value.has_value(),
                  "--replicas must list each stage's replicas as positive integers separated by "
                  "commas (e.g. 3,1), got '",
                  text, "'");
    replicas.push_back(*value);
  }
  return replicas;
}

// The request of the flags: --schedule NAME and what goes with it, or --import FILE.csv.
ScheduleRequest request_of(const ScheduleArgs& args, ScheduleSolver solver) {
  ScheduleRequest request;
  if (!args.import_path.empty()) {
    PPTRAIN_CHECK(args.schedule.empty(), "--schedule and --import cannot be used together (got ",
                  "--schedule ", args.schedule, " and --import ", args.import_path, ")");
    PPTRAIN_CHECK(args.skips.empty(), "--skip does not apply to --import: the file's skip ",
                  "messages (0SEND_F3>2 ...) give its skips");
    request.file = args.import_path;
  }
  request.schedule = args.schedule;
  if (args.pp_given) request.pp = args.pp;
  if (args.microbatches_given) request.microbatches = args.microbatches;
  request.chunks = args.chunks;
  if (!args.replicas.empty()) request.replicas = parse_replicas(args.replicas);
  request.steps = args.steps;
  request.family = args.family;
  request.dp = args.dp;
  request.memory_limit = args.memory_limit;
  request.solver = solver;
  request.time_limit_s = args.time_limit_s;
  if (!args.skips.empty()) {
    request.skips.emplace();
    for (const std::string& skip : args.skips) request.skips->push_back(parse_skip(skip));
  }
  return request;
}

void run_schedule_command(const ScheduleArgs& args) {
  // Its tables in huge pages (common/malloc.h): measured faster here, not for `plan`, whose
  // smaller memory is touched later in the run (docs/PERFORMANCE.md).
  heap_in_huge_pages();
  if (args.list) {
    std::fputs(schedule_table_markdown().c_str(), stdout);
    return;
  }
  check_data_parallel(args.dp);
  const ScheduleSolver solver = parse_solver(args.solver);
  PPTRAIN_CHECK(!args.time_limit_given || solver == ScheduleSolver::kIlp,
                "--time-limit applies to --solver ilp only (the heuristic takes milliseconds)");
  const ScheduleRequest request = request_of(args, solver);
  CostModel cost = cost_model_from_flags(args.cost, args.mem_w_ratio);
  if (!args.profile.empty()) {
    const int stages = !request.file.empty() ? read_schedule_csv(request.file).num_stages
                       : !request.replicas.empty()
                           ? static_cast<int>(request.replicas.size())
                           : args.pp * resolve_chunks(find_schedule(args.schedule), args.chunks);
    PPTRAIN_CHECK(args.cost == ScheduleArgs().cost, "give --cost or --profile, not both");
    cost = profile_stage_costs(args.profile, args.stage_layers, stages, args.dp, args.mem_w_ratio);
  }
  cost.replicas = args.dp;
  PPTRAIN_CHECK(args.cores >= 0, "--cores must be >= 0 (0: a core per rank), got ", args.cores);
  // The D copies of the pipeline run alike, each on its share of the cores.
  cost.cores = args.cores / args.dp;
  RunRequest run;  // a schedule to look at: nothing trains
  run.schedule = request;
  RequestedSchedule made = resolve_run(run, cost).schedule;
  // A timeline only to draw or trace: without, the figures cost no event per action.
  const bool drawn = !args.svg_path.empty() || !args.trace_path.empty();
  SimResult result = simulate_requested(made, cost, args.memory_limit,
                                        drawn ? Record::kTimeline : Record::kFigures);

  write_schedule_files(made, cost, result,
                       {args.export_path, args.svg_path, args.trace_path, args.with_comms});
  if (args.grid) {
    GridOptions options;
    options.with_comms = args.with_comms;
    // With --json, stdout holds the JSON object alone.
    std::fputs(
        render_grid(args.with_comms ? *made.validated : made.validated.given(), options).c_str(),
        args.json ? stderr : stdout);
    if (!args.json) std::fputs("\n", stdout);
  }
  if (args.json) {
    std::cout << schedule_summary_json(made, cost, args.memory_limit, result, solver).dump()
              << std::endl;
  } else {
    std::fputs(schedule_summary_text(made, cost, args.memory_limit, result).c_str(), stdout);
  }
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto args = std::make_shared<ScheduleArgs>();
  CLI::App* cmd = app.add_subcommand(
      "schedule", "Generate (or import) a pipeline schedule, validate it and simulate it");
  cmd->add_option("--schedule", args->schedule, "Schedule to generate (see the list below)");
  cmd->add_flag("--list", args->list, "Print the schedules as a markdown table and exit");
  cmd->footer("Schedules (P ranks, M microbatches, V chunks per rank):\n" + schedule_help_text());
  auto* pp = cmd->add_option("--pp", args->pp, "Pipeline ranks (P)");
  auto* microbatches =
      cmd->add_option("--microbatches", args->microbatches, "Microbatches per mini-batch (M)");
  auto* chunks = cmd->add_option("--chunks", args->chunks,
                                 "Stages per rank (V); 0 or absent: the schedule's default");
  cmd->add_option("--cost", args->cost,
                  "Cost model: times of one rank's share for one microbatch, the comm latency, "
                  "(weights=) the memory of one version of its weights, and (reduce=) the time "
                  "of one all-reduce of its gradients over the --dp copies (or over a replicated "
                  "stage's replicas: chimera, gems, 1f1b-rr)")
      ->capture_default_str();
  cmd->add_option("--memory-limit", args->memory_limit,
                  "Cap on every rank's peak activations, in units of one microbatch's forward "
                  "activations on a stage (P: 1F1B's memory); zb-auto plans under it, another "
                  "schedule whose simulated peak is above it is refused; 0: none")
      ->capture_default_str();
  cmd->add_option("--solver", args->solver,
                  "How zb-auto orders the actions: heuristic (the zero-bubble paper's greedy) or "
                  "ilp (its integer program solved by CBC, warm-started from the greedy, never "
                  "worse; reports whether it proved optimality and the gap)")
      ->capture_default_str();
  auto* time_limit =
      cmd->add_option("--time-limit", args->time_limit_s,
                      "--solver ilp: seconds CBC may search (wall time); then the best order found")
          ->capture_default_str();
  cmd->add_option("--mem-w-ratio", args->mem_w_ratio,
                  "Share r of a microbatch's activations that W still needs after I (I frees "
                  "1 - r, W frees r)")
      ->capture_default_str();
  cmd->add_option("--import", args->import_path,
                  "Read the schedule from a CSV file instead of generating it (P, V, M and "
                  "placement are inferred)");
  cmd->add_option("--export", args->export_path, "Write the schedule as CSV");
  cmd->add_flag("--with-comms", args->with_comms,
                "Export (and show) SEND/RECV actions too, not only compute");
  cmd->add_option("--svg", args->svg_path, "Write the simulated timeline as an SVG picture");
  cmd->add_option("--trace", args->trace_path,
                  "Write the simulated timeline as Chrome trace JSON (1 cost unit = 1 ms)");
  cmd->add_flag("--grid", args->grid, "Print the schedule as a text grid");
  cmd->add_flag("--json", args->json, "Print the summary as one JSON object");
  cmd->add_option("--steps", args->steps,
                  "Asynchronous schedules: mini-batches shown in one run (no flush between them)")
      ->capture_default_str();
  cmd->add_option("--profile", args->profile,
                  "Costs from a `pptrain profile` file (ms; with its all-reduce measurement for "
                  "--dp) instead of --cost: predicts a run's step time");
  cmd->add_option("--stage-layers", args->stage_layers,
                  "With --profile: each stage's layers, e.g. 0-4,5-9 (default: the time "
                  "partition of the profile)");
  cmd->add_option("--cores", args->cores,
                  "Cores of the host all D x P ranks run on (e.g. 2 for --pp 2 --dp 2 on 2 cores): "
                  "computing ranks share them evenly; 0 (default): a core per rank");
  cmd->add_option("--skip", args->skips,
                  "A skip connection FROM:TO (stages, TO > FROM + 1; repeatable): lowering adds "
                  "its messages (0SEND_F3>2 ...), which --with-comms shows; not with --import, "
                  "whose file has its own");
  cmd->add_option("--dp", args->dp,
                  "Data-parallel copies of the pipeline (D): above 1, each stage all-reduces its "
                  "gradients (REDUCE_GRAD) after its last W or B, taking reduce= of --cost")
      ->capture_default_str();
  cmd->add_option("--replicas", args->replicas,
                  "1f1b-rr (PipeDream's round robin): replicas of each stage, e.g. 3,1 (stage 0 "
                  "on ranks 0-2, stage 1 on rank 3; microbatch i on replica i mod r)");
  add_family_flags(cmd, args->family);
  cmd->callback([args, pp, microbatches, chunks, time_limit] {
    args->pp_given = pp->count() > 0;
    args->time_limit_given = time_limit->count() > 0;
    args->microbatches_given = microbatches->count() > 0;
    args->chunks_given = chunks->count() > 0 && args->chunks != 0;
    run_schedule_command(*args);
  });
}

}  // namespace pptrain::cli
