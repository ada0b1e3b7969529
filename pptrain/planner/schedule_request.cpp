#include "pptrain/planner/schedule_request.h"

#include <cstdio>
#include <set>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/common/format.h"
#include "pptrain/generators/auto_schedule.h"
#include "pptrain/generators/generators.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"
#include "pptrain/schedule/reductions.h"

namespace pptrain {
namespace {

// "dir/1f1b.csv" -> "1f1b": a file's schedule is named after it unless the request names it.
std::string file_stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0) name.resize(dot);
  return name.empty() ? "imported" : name;
}

// A request's own file; what it gives must match what the file holds.
Schedule file_schedule(const ScheduleRequest& request) {
  Schedule s = read_schedule_csv(request.file);
  s.name = request.file_name.empty() ? file_stem(request.file) : request.file_name;
  const OptionNames& names = request.names;
  const auto agree = [&](std::optional<int> given, const std::string& option, int inferred,
                         const char* what) {
    PPTRAIN_CHECK(!given || *given == inferred, option, " ", given.value_or(0), " does not match '",
                  request.file, "', which has ", inferred, " ", what);
  };
  agree(request.pp, names.pp, s.num_ranks, "ranks");
  agree(request.microbatches, names.microbatches, s.num_microbatches, "microbatches");
  agree(request.chunks ? std::optional<int>(request.chunks) : std::nullopt, names.chunks,
        s.chunks(), "chunks (stages per rank)");
  return s;
}

// The ranks `request.replicas` place 1f1b-rr's stages on (their sum), which a given --pp must be.
int round_robin_ranks(const ScheduleRequest& request) {
  const OptionNames& names = request.names;
  long long ranks = 0;
  for (int r : request.replicas) ranks += r;
  const std::string replicas = replicas_text(request.replicas);
  PPTRAIN_CHECK(ranks <= kMaxRanks, "--replicas ", replicas, " asks for more than the ", kMaxRanks,
                " ranks pptrain plans");
  PPTRAIN_CHECK(!request.pp || *request.pp == ranks, names.pp, " ", request.pp.value_or(0),
                " does not match --replicas ", replicas, ", which places the stages on ", ranks,
                " ranks");
  return static_cast<int>(ranks);
}

// The --pp 1 reference of a registry schedule (ScheduleRequest::one_process).
Schedule one_process_schedule(const ScheduleRequest& request, long long run_microbatches,
                              bool asynchronous) {
  const int M = static_cast<int>(run_microbatches);
  // One synchronous stage: every forward, then every backward (GPipe on one rank).
  Schedule s = !asynchronous && request.stages <= 1
                   ? make_gpipe(1, M)
                   : make_serial(std::max(request.stages, 1), M, !asynchronous);
  s.name = request.schedule;
  return s;
}

Schedule generate_schedule(const ScheduleRequest& request, const CostModel& cost, IlpReport* ilp) {
  const OptionNames& names = request.names;
  PPTRAIN_CHECK(!request.schedule.empty(), "--schedule NAME (one of ", schedule_names_text(),
                ") or --import FILE.csv is required");
  const ScheduleEntry& entry = find_schedule(request.schedule);
  PPTRAIN_CHECK(request.replicas.empty() || entry.takes_replicas, "--replicas applies to ",
                "--schedule ", kRoundRobinSchedule, " only, not '", request.schedule, "'");
  const std::optional<int> given_pp =
      request.replicas.empty() ? request.pp : round_robin_ranks(request);
  PPTRAIN_CHECK(given_pp.has_value(), names.pp,
                " is required with --schedule (the number of pipeline ranks)");
  PPTRAIN_CHECK(request.microbatches.has_value(), names.microbatches,
                " is required with --schedule (microbatches per mini-batch)");
  const int pp = *given_pp, microbatches = *request.microbatches;
  PPTRAIN_CHECK(pp >= 1, names.pp, " must be >= 1, got ", pp);
  PPTRAIN_CHECK(microbatches >= 1, names.microbatches, " must be >= 1, got ", microbatches);
  PPTRAIN_CHECK(request.chunks >= 0, names.chunks,
                " must be >= 1 (or 0 for the schedule's default), got ", request.chunks);
  // Checked even where the chunks make no difference (one process), so that a value --pp 2
  // would refuse is refused everywhere.
  const int chunks = resolve_chunks(entry, request.chunks);
  // An asynchronous schedule never flushes: one list over `steps` mini-batches, its
  // microbatches numbered across steps (and in `pptrain schedule`, the steady state across step
  // boundaries is what the simulator and the pictures show).
  const bool asynchronous = entry.asynchronous();
  long long run_microbatches = microbatches;
  if (asynchronous) {
    PPTRAIN_CHECK(request.steps >= 1, names.steps, " must be >= 1, got ", request.steps);
    run_microbatches *= request.steps;
  }
  // The limit on the list's size, named by what the user gave (make_schedule checks it too).
  check_schedule_size(
      pp, request.one_process ? std::max(request.stages, 1) : chunks, run_microbatches,
      asynchronous ? names.microbatches + " " + std::to_string(microbatches) + " x " + names.steps +
                         " " + std::to_string(request.steps) + " ="
                   : names.microbatches);
  if (request.one_process) return one_process_schedule(request, run_microbatches, asynchronous);
  if (!request.solved_file.empty()) {
    Schedule solved = read_schedule_csv(request.solved_file);
    solved.name = request.schedule;
    return solved;
  }
  ScheduleOptions options;
  options.name = request.schedule;
  options.ranks = pp;
  options.microbatches = static_cast<int>(run_microbatches);
  options.chunks = chunks;
  // zb-auto plans for the cost model and the limit; the other generators ignore them.
  options.costs = cost.stage_costs(pp * chunks, pp);
  options.memory_limit = request.memory_limit;
  options.period = microbatches;
  options.solver = request.solver;
  options.time_limit_s = request.time_limit_s;
  options.ilp_report = ilp;
  options.replicas = request.replicas;
  return make_schedule(options);
}

// Skip links sorted and distinct, as Schedule::skips holds them.
std::vector<SkipLink> sorted_skips(const std::vector<SkipLink>& skips) {
  const std::set<SkipLink> distinct(skips.begin(), skips.end());
  return {distinct.begin(), distinct.end()};
}

// Sets a schedule's skip links; a file's own must be the same.
void set_skips(Schedule& schedule, const std::vector<SkipLink>& skips) {
  const std::vector<SkipLink> sorted = sorted_skips(skips);
  PPTRAIN_CHECK(schedule.skips.empty() || schedule.skips == sorted, "schedule '", schedule.name,
                "' has skip messages of its own between other stages than the model's skips");
  schedule.skips = sorted;
}

// The registry entry whose weight rule a request's schedule runs under; null for a file
// (synchronous).
const ScheduleEntry* rule_entry(const ScheduleRequest& request) {
  if (!request.file.empty() || request.schedule.empty()) return nullptr;
  return &find_schedule(request.schedule);
}

}  // namespace

void check_data_parallel(int dp, const std::string& dp_name) {
  PPTRAIN_CHECK(dp >= 1, dp_name, " must be >= 1 (data-parallel copies of the pipeline), got ", dp);
}

std::string replicas_text(const std::vector<int>& replicas) {
  std::string text;
  for (size_t s = 0; s < replicas.size(); ++s) {
    text += (s ? "," : "") + std::to_string(replicas[s]);
  }
  return text;
}

SkipLink parse_skip(const std::string& text) {
  const size_t colon = text.find(':');
  const auto number = [&](const std::string& piece) {
    size_t used = 0;
    int value = -1;
    try {
      value = std::stoi(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    PPTRAIN_CHECK(used > 0 && used == piece.size() && value >= 0,
                  "--skip must be FROM:TO, two stage numbers such as 0:3, got '", text, "'");
    return value;
  };
  PPTRAIN_CHECK(colon != std::string::npos,
                "--skip must be FROM:TO, two stage numbers such as 0:3, got '", text, "'");
  return {number(text.substr(0, colon)), number(text.substr(colon + 1))};
}

RequestedSchedule make_requested_schedule(const ScheduleRequest& request, const CostModel& cost) {
  check_data_parallel(request.dp, request.names.dp);
  check_solver_applies(request.solver, request.file.empty() ? request.schedule : "");
  IlpReport ilp;
  Schedule schedule =
      request.file.empty() ? generate_schedule(request, cost, &ilp) : file_schedule(request);
  if (request.skips) set_skips(schedule, *request.skips);
  const std::string what = request.file.empty() ? "schedule '" + schedule.name + "'"
                                                : "schedule file '" + request.file + "'";
  try {
    RequestedSchedule made = prepare_schedule(std::move(schedule), request);
    if (request.solver == ScheduleSolver::kIlp) made.ilp = ilp;
    return made;
  } catch (const ScheduleError& e) {
    throw ScheduleError(e.rank(), e.position(), e.message(), what + " is not valid: " + e.what());
  }
}

RequestedSchedule prepare_schedule(Schedule schedule, const ScheduleRequest& request) {
  const int dp = request.dp;
  const std::string& dp_name = request.names.dp;
  check_data_parallel(dp, dp_name);
  PPTRAIN_CHECK(!schedule.replicated() || dp == 1, dp_name, " ", dp, " does not apply to '",
                schedule.name,
                "': its stages are replicated already, and its replicas sum their gradients");
  PPTRAIN_CHECK(dp == 1 || schedule.flushes, dp_name, " ", dp,
                " needs a synchronous schedule, but ", schedule.name,
                " does not flush (its stages step inside the run, with no step end at which to "
                "all-reduce the gradients)");
  const ScheduleEntry* entry = rule_entry(request);
  const bool averages = entry && entry->averages_copies;
  // What runs: the replicas or the copies of each stage combine its gradients (a file may
  // place its own).
  schedule = with_grad_reductions(std::move(schedule), dp, averages);
  // Validation reports problems at the positions of the schedule as given (the user's file, for
  // an import); it lowers a compute-only one when its messages are first asked for.
  VersionRule rule =
      version_rule_of(entry ? entry->name : std::string(), schedule.num_stages,
                      request.microbatches.value_or(schedule.num_microbatches), request.family);
  return RequestedSchedule{validate(std::move(schedule)), rule, averages, std::nullopt};
}

RequestedSchedule with_skips(RequestedSchedule made, const std::vector<SkipLink>& skips) {
  Schedule schedule = made.validated.given();
  if (schedule.skips == sorted_skips(skips)) return made;
  set_skips(schedule, skips);
  made.validated = validate(std::move(schedule));
  return made;
}

SimResult simulate_requested(const RequestedSchedule& made, const CostModel& cost,
                             double memory_limit, Record record) {
  SimResult result = simulate(made.validated, cost, made.rule, record);
  const Schedule& s = made.validated.given();
  // A replicated schedule's shares are those a microbatch passes (Schedule::shares).
  const int shares = s.shares();
  check_feasible_memory_limit(cost.stage_costs(s.num_stages, shares), memory_limit);
  check_peak_within_limit(result, memory_limit, s.name);
  return result;
}

std::string schedule_timeline_title(const RequestedSchedule& made, const CostModel& cost,
                                    const SimResult& result) {
  const Schedule& s = made.validated.given();
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "%.1f%%", 100 * result.bubble_ratio);
  return s.name + ": P=" + std::to_string(s.num_ranks) + ", V=" + std::to_string(s.chunks()) +
         ", M=" + std::to_string(s.num_microbatches) +
         (cost.replicas > 1 ? ", D=" + std::to_string(cost.replicas) : "") + ", bubble " + bubble +
         " (" + cost.to_string() + ")";
}

nlohmann::ordered_json schedule_summary_json(const RequestedSchedule& made, const CostModel& cost,
                                             double memory_limit, const SimResult& result,
                                             ScheduleSolver solver) {
  const Schedule& s = made.validated.given();
  nlohmann::ordered_json out;
  out["schedule"] = s.name;
  out["weight_update"] = made.rule.name();
  out["pp"] = s.num_ranks;
  out["chunks"] = s.chunks();
  out["microbatches"] = s.num_microbatches;
  out["dp"] = cost.replicas;
  out["makespan"] = result.makespan;
  out["bubble_ratio"] = result.bubble_ratio;
  out["mem_w_ratio"] = cost.mem_w_ratio;
  out["memory_limit"] = memory_limit;  // 0: none
  out["ranks"] = nlohmann::ordered_json::array();
  for (const auto& r : result.ranks) {
    nlohmann::ordered_json rank;
    rank["rank"] = r.rank;
    rank["busy"] = r.busy;
    rank["idle"] = r.idle;
    rank["peak_activations"] = r.peak_activations;
    rank["peak_memory"] = r.peak_memory;
    rank["weight_versions"] = r.weight_versions;
    out["ranks"].push_back(std::move(rank));
  }
  if (!s.skips.empty()) {
    out["skips"] = nlohmann::ordered_json::array();
    for (const SkipLink& skip : s.skips) out["skips"].push_back({skip.from, skip.to});
  }
  out["solver"] = solver_name(solver);
  if (made.ilp) {
    const IlpReport& ilp = *made.ilp;
    out["ilp"] = {{"proven_optimal", ilp.proven_optimal},
                  {"objective", ilp.objective},
                  {"heuristic", ilp.heuristic},
                  {"best_bound", ilp.best_bound},
                  {"gap", ilp.gap},
                  {"improved", ilp.improved},
                  {"binaries", ilp.binaries},
                  {"solve_s", ilp.solve_s}};
  }
  return out;
}

namespace {

std::string percent(double ratio) {
  std::string out;
  append_format(out, "%.1f%%", 100 * ratio);
  return out;
}

}  // namespace

std::string schedule_summary_text(const RequestedSchedule& made, const CostModel& cost,
                                  double memory_limit, const SimResult& result) {
  const Schedule& s = made.validated.given();
  const VersionRule& rule = made.rule;
  std::string out;
  append_format(out, "schedule      %s\n", s.name.c_str());
  if (rule.asynchronous()) {
    append_format(out, "weights       %s, no flush: %d steps of %d microbatches in one run\n",
                  rule.name(), s.num_microbatches / rule.microbatches_per_step,
                  rule.microbatches_per_step);
  }
  append_format(out, "ranks (P)     %d\n", s.num_ranks);
  append_format(out, "chunks (V)    %d\n", s.chunks());
  append_format(out, "microbatches  %d\n", s.num_microbatches);
  if (cost.replicas > 1) {
    append_format(out,
                  "replicas (D)  %d: each stage all-reduces its gradients after its last W or B\n",
                  cost.replicas);
  }
  out += "cost model    " + cost.to_string() + "\n";
  append_format(out, "memory        W keeps r = %g of a microbatch's activations after I",
                cost.mem_w_ratio);
  if (memory_limit > 0) append_format(out, "; limit %g per rank", memory_limit);
  out += "\n";
  append_format(out, "makespan      %g\n", result.makespan);
  append_format(out, "bubble ratio  %.4f (%s)\n", result.bubble_ratio,
                percent(result.bubble_ratio).c_str());
  // The peak memory column only when the weights are counted: otherwise it repeats the
  // activations.
  const bool weights = cost.counts_weights();
  append_format(out, "\nrank  %10s  %10s  %16s  %15s%s\n", "busy", "idle", "peak activations",
                "weight versions", weights ? "  peak memory" : "");
  for (const auto& r : result.ranks) {
    append_format(out, "%4d  %10g  %10g  %16g  %15d", r.rank, r.busy, r.idle, r.peak_activations,
                  r.weight_versions);
    if (weights) append_format(out, "  %11g", r.peak_memory);
    out += "\n";
  }
  if (made.ilp) {
    const IlpReport& ilp = *made.ilp;
    append_format(
        out, "solver        ilp: span %g (heuristic %g), %s, best bound %g, gap %s, %.2f s\n",
        ilp.objective, ilp.heuristic, ilp.proven_optimal ? "proven optimal" : "not proven",
        ilp.best_bound, percent(ilp.gap).c_str(), ilp.solve_s);
  }
  return out;
}

void write_schedule_files(const RequestedSchedule& made, const CostModel& cost, SimResult& result,
                          const ScheduleFiles& files) {
  if (!files.csv_path.empty()) {
    write_text_file(
        files.csv_path,
        to_csv(files.with_comms ? *made.validated : strip_comms(made.validated.given())),
        "--export file");
  }
  result.timeline.title = schedule_timeline_title(made, cost, result);
  if (!files.svg_path.empty()) {
    SvgOptions options;
    options.show_comms = files.with_comms;
    write_text_file(files.svg_path, render_svg(result.timeline, options), "--svg file");
  }
  if (!files.trace_path.empty()) {
    write_text_file(files.trace_path, render_chrome_trace(result.timeline), "--trace file");
  }
}

CostModel profile_stage_costs(const std::string& profile_path, const std::string& stage_layers,
                              int stages, int dp, double mem_w_ratio) {
  const Profile profile = read_profile(profile_path);
  std::vector<LayerRange> ranges;
  if (!stage_layers.empty()) {
    ranges = parse_stage_layers(stage_layers);
    PPTRAIN_CHECK(static_cast<int>(ranges.size()) == stages, "--stage-layers '", stage_layers,
                  "' has ", ranges.size(), " stages, the schedule ", stages);
  } else {
    PartitionOptions options;
    options.method = "time";
    options.stages = stages;
    for (const StagePlan& stage : make_partition(profile, options).stages) {
      ranges.emplace_back(stage.first_layer, stage.last_layer);
    }
  }
  CostModel cost = cost_from_profile(profile, ranges, dp);
  cost.mem_w_ratio = mem_w_ratio;
  return cost;
}

}  // namespace pptrain
