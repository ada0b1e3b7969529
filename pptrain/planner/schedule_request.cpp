#include "pptrain/planner/schedule_request.h"

#include <cstdarg>
#include <cstdio>
#include <set>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"
#include "pptrain/schedule/auto_schedule.h"
#include "pptrain/schedule/generators.h"
#include "pptrain/schedule/reductions.h"

namespace pptrain {
namespace {

Schedule round_robin_schedule(const ScheduleRequest& request) {
  PPTRAIN_CHECK(!request.replicas.empty(), "--schedule ", kRoundRobinSchedule,
                " needs --replicas R0,R1,... (the replicas of each stage, e.g. 3,1)");
  PPTRAIN_CHECK(request.microbatches.has_value(),
                "--microbatches is required with --schedule (microbatches per mini-batch)");
  PPTRAIN_CHECK(request.chunks == 0, "--chunks does not apply to --schedule ", kRoundRobinSchedule,
                " (one stage per rank)");
  long long ranks = 0;
  for (int r : request.replicas) ranks += r;
  const std::string replicas = replicas_text(request.replicas);
  PPTRAIN_CHECK(ranks <= kMaxRanks, "--replicas ", replicas, " asks for more than the ", kMaxRanks,
                " ranks pptrain plans");
  PPTRAIN_CHECK(!request.pp || *request.pp == ranks, "--pp ", request.pp.value_or(0),
                " does not match --replicas ", replicas, ", which places the stages on ", ranks,
                " ranks");
  check_schedule_size(static_cast<int>(ranks), 1, *request.microbatches);
  return make_1f1b_rr(request.replicas, *request.microbatches);
}

Schedule generate_schedule(const ScheduleRequest& request, const CostModel& cost, IlpReport* ilp) {
  PPTRAIN_CHECK(!request.schedule.empty(), "--schedule NAME (one of ", schedule_names_text(),
                ", or ", kRoundRobinSchedule, " with --replicas) or --import FILE.csv is required");
  if (request.schedule == kRoundRobinSchedule) return round_robin_schedule(request);
  PPTRAIN_CHECK(request.replicas.empty(), "--replicas applies to --schedule ", kRoundRobinSchedule,
                " only, not '", request.schedule, "'");
  PPTRAIN_CHECK(request.pp.has_value(),
                "--pp is required with --schedule (the number of pipeline ranks)");
  PPTRAIN_CHECK(request.microbatches.has_value(),
                "--microbatches is required with --schedule (microbatches per mini-batch)");
  const int pp = *request.pp, microbatches = *request.microbatches;
  PPTRAIN_CHECK(pp >= 1, "--pp must be >= 1, got ", pp);
  PPTRAIN_CHECK(microbatches >= 1, "--microbatches must be >= 1, got ", microbatches);
  PPTRAIN_CHECK(request.chunks >= 0,
                "--chunks must be >= 1 (or 0 for the schedule's default), got ", request.chunks);
  PPTRAIN_CHECK(request.steps >= 1 && request.steps <= 1000, "--steps must be 1 .. 1000, got ",
                request.steps);
  const ScheduleEntry& entry = find_schedule(request.schedule);
  ScheduleOptions options;
  options.name = request.schedule;
  options.ranks = pp;
  // An asynchronous schedule never flushes: show `steps` mini-batches in one list, so the
  // steady state across step boundaries is what the simulator and the pictures show.
  const bool asynchronous = entry.asynchronous();
  if (asynchronous) {
    // The limit on the list's size, named by what the user gave (make_schedule checks it too).
    check_schedule_size(pp, resolve_chunks(entry, request.chunks),
                        static_cast<long long>(request.steps) * microbatches,
                        "--microbatches " + std::to_string(microbatches) + " x --steps " +
                            std::to_string(request.steps) + " =");
  }
  options.microbatches = asynchronous ? request.steps * microbatches : microbatches;
  options.chunks = request.chunks;
  // zb-auto plans for the cost model and the limit; the other generators ignore them.
  const int stages = pp * resolve_chunks(entry, request.chunks);
  options.costs = cost.stage_costs(stages, pp);
  options.memory_limit = request.memory_limit;
  options.period = microbatches;
  options.solver = request.solver;
  options.time_limit_s = request.time_limit_s;
  options.ilp_report = ilp;
  return make_schedule(options);
}

}  // namespace

void check_data_parallel(int dp) {
  PPTRAIN_CHECK(dp >= 1, "--dp must be >= 1 (data-parallel copies of the pipeline), got ", dp);
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
  check_data_parallel(request.dp);
  check_solver_applies(request.solver, request.schedule);
  IlpReport ilp;
  Schedule schedule = generate_schedule(request, cost, &ilp);
  const std::set<SkipLink> skips(request.skips.begin(), request.skips.end());
  schedule.skips.assign(skips.begin(), skips.end());
  const bool round_robin = request.schedule == kRoundRobinSchedule;
  const bool averages = !round_robin && find_schedule(request.schedule).averages_copies;
  RequestedSchedule made =
      prepare_schedule(std::move(schedule), round_robin ? std::string() : request.schedule,
                       request.vertical_sync, *request.microbatches, request.dp, averages);
  if (request.solver == ScheduleSolver::kIlp) made.ilp = ilp;
  return made;
}

RequestedSchedule prepare_schedule(Schedule schedule, const std::string& rule_name,
                                   bool vertical_sync, int microbatches_per_step, int dp,
                                   bool averages_copies) {
  check_data_parallel(dp);
  PPTRAIN_CHECK(!schedule.replicated() || dp == 1, "--dp ", dp, " does not apply to '",
                schedule.name,
                "': its stages are replicated already, and its replicas sum their gradients");
  PPTRAIN_CHECK(dp == 1 || schedule.flushes, "--dp ", dp, " needs a synchronous schedule, but ",
                schedule.name,
                " does not flush (its stages step inside the run, with no step end at which to "
                "all-reduce the gradients)");
  // What runs: the replicas or the copies of each stage combine its gradients (a file may
  // place its own).
  schedule = with_grad_reductions(std::move(schedule), dp, averages_copies);
  // Validation reports problems at the positions of the schedule as given (the user's file, for
  // an import); it lowers a compute-only one when its messages are first asked for.
  VersionRule rule =
      version_rule_of(rule_name, vertical_sync, schedule.num_stages, microbatches_per_step);
  return RequestedSchedule{validate(std::move(schedule)), rule, std::nullopt};
}

SimResult simulate_requested(const RequestedSchedule& made, const CostModel& cost,
                             double memory_limit, Record record) {
  SimResult result = simulate(made.validated, cost, made.rule, record);
  const Schedule& s = made.validated.given();
  // A replicated schedule's every stage is one rank's share (V = 1): S shares, not P.
  const int shares = s.replicated() ? s.num_stages : s.num_ranks;
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

// printf's formatting appended to `out`.
__attribute__((format(printf, 2, 3))) void append(std::string& out, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  PPTRAIN_ASSERT(n >= 0 && n < static_cast<int>(sizeof buffer), "a summary line of ", n,
                 " characters");
  out += buffer;
}

std::string percent(double ratio) {
  std::string out;
  append(out, "%.1f%%", 100 * ratio);
  return out;
}

// "dir/1f1b.csv" -> "1f1b": an imported schedule is named after its file.
std::string file_stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0) name.resize(dot);
  return name.empty() ? "imported" : name;
}

}  // namespace

std::string schedule_summary_text(const RequestedSchedule& made, const CostModel& cost,
                                  double memory_limit, const SimResult& result) {
  const Schedule& s = made.validated.given();
  const VersionRule& rule = made.rule;
  std::string out;
  append(out, "schedule      %s\n", s.name.c_str());
  if (rule.asynchronous()) {
    append(out, "weights       %s, no flush: %d steps of %d microbatches in one run\n", rule.name(),
           s.num_microbatches / rule.microbatches_per_step, rule.microbatches_per_step);
  }
  append(out, "ranks (P)     %d\n", s.num_ranks);
  append(out, "chunks (V)    %d\n", s.chunks());
  append(out, "microbatches  %d\n", s.num_microbatches);
  if (cost.replicas > 1) {
    append(out, "replicas (D)  %d: each stage all-reduces its gradients after its last W or B\n",
           cost.replicas);
  }
  out += "cost model    " + cost.to_string() + "\n";
  append(out, "memory        W keeps r = %g of a microbatch's activations after I",
         cost.mem_w_ratio);
  if (memory_limit > 0) append(out, "; limit %g per rank", memory_limit);
  out += "\n";
  append(out, "makespan      %g\n", result.makespan);
  append(out, "bubble ratio  %.4f (%s)\n", result.bubble_ratio,
         percent(result.bubble_ratio).c_str());
  // The peak memory column only when the weights are counted: otherwise it repeats the
  // activations.
  const bool weights = cost.counts_weights();
  append(out, "\nrank  %10s  %10s  %16s  %15s%s\n", "busy", "idle", "peak activations",
         "weight versions", weights ? "  peak memory" : "");
  for (const auto& r : result.ranks) {
    append(out, "%4d  %10g  %10g  %16g  %15d", r.rank, r.busy, r.idle, r.peak_activations,
           r.weight_versions);
    if (weights) append(out, "  %11g", r.peak_memory);
    out += "\n";
  }
  if (made.ilp) {
    const IlpReport& ilp = *made.ilp;
    append(out, "solver        ilp: span %g (heuristic %g), %s, best bound %g, gap %s, %.2f s\n",
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

Schedule import_schedule(const std::string& path, std::optional<int> pp,
                         std::optional<int> microbatches, std::optional<int> chunks) {
  Schedule s = read_schedule_csv(path);
  s.name = file_stem(path);
  const auto agree = [&](std::optional<int> given, const char* flag, int inferred,
                         const char* what) {
    PPTRAIN_CHECK(!given || *given == inferred, flag, " ", given.value_or(0), " does not match '",
                  path, "', which has ", inferred, " ", what);
  };
  agree(pp, "--pp", s.num_ranks, "ranks");
  agree(microbatches, "--microbatches", s.num_microbatches, "microbatches");
  agree(chunks, "--chunks", s.chunks(), "chunks (stages per rank)");
  return s;
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
