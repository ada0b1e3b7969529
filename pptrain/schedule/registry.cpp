#include "pptrain/schedule/registry.h"

#include <cstdio>

#include "pptrain/common/check.h"
#include "pptrain/schedule/generators.h"

namespace pptrain {
namespace {

// A generator that takes no chunk count (it runs the one its entry allows).
template <Schedule (*Make)(int, int)>
Schedule without_chunks(const ScheduleOptions& o) {
  return Make(o.ranks, o.microbatches);
}

Schedule with_chunks(const ScheduleOptions& o) {
  return make_interleaved_1f1b(o.ranks, o.microbatches, o.chunks);
}

Schedule zb_auto(const ScheduleOptions& o) {
  const AutoScheduleOptions options{o.ranks, o.microbatches, o.costs, o.memory_limit,
                                    o.rank_memory_limits};
  if (o.solver == ScheduleSolver::kIlp) return make_zb_ilp(options, o.time_limit_s, o.ilp_report);
  return make_zb_auto(options);
}

// An asynchronous schedule: the 1F1B order without a flush; they differ only in their rule.
ScheduleEntry async_1f1b(const std::string& name, const std::string& summary, WeightUpdate update) {
  const auto make = [name](const ScheduleOptions& o) {
    Schedule schedule = make_1f1b(o.ranks, o.microbatches);
    schedule.name = name;
    schedule.flushes = false;
    return schedule;
  };
  return {name, 1, 1, 1, summary, make, update};
}

std::string chunks_text(const ScheduleEntry& e) {
  if (e.min_chunks == e.max_chunks) return std::to_string(e.min_chunks);
  const std::string range = e.max_chunks
                                ? std::to_string(e.min_chunks) + "-" + std::to_string(e.max_chunks)
                                : ">= " + std::to_string(e.min_chunks);
  return range + " (default " + std::to_string(e.default_chunks) + ")";
}

}  // namespace

const std::vector<ScheduleEntry>& schedule_registry() {
  static const std::vector<ScheduleEntry> entries = {
      {"gpipe", 1, 1, 1,
       "GPipe: all forwards, then all backwards; bubble (P-1)/(M+P-1), M microbatches of "
       "activations",
       without_chunks<make_gpipe>},
      {"1f1b", 1, 1, 1,
       "PipeDream-Flush / DAPPLE: warm-up forwards, then one forward one backward; GPipe's "
       "bubble with at most P microbatches of activations",
       without_chunks<make_1f1b>},
      {"interleaved-1f1b", 2, 2, 0,
       "Megatron's virtual stages: stage s on rank s mod P, 1/V of 1F1B's bubble; M a multiple "
       "of P",
       with_chunks},
      {"zb-h1", 1, 1, 1,
       "zero bubble H1: backward split into I and W, the W's fill 1F1B's bubble; 1F1B's memory",
       without_chunks<make_zb_h1>},
      {"zb-h2", 1, 1, 1,
       "zero bubble H2: more warm-up forwards, no bubble when F = I = W; about twice 1F1B's "
       "memory",
       without_chunks<make_zb_h2>},
      {"zb-v", 2, 2, 2,
       "zero bubble V: rank r holds stages r and 2P-1-r; no bubble from M >= 2P with 1F1B's "
       "memory",
       without_chunks<make_zb_v>},
      {"zb-auto", 1, 1, 1,
       "zero bubble, automatic: the paper's greedy places F, I, W for the cost model (--cost) "
       "under --memory-limit K (one microbatch's activations on a stage = 1; P: ZB-1p, 2P: "
       "ZB-2p)",
       zb_auto},
      {"v-half", 2, 2, 2,
       "V-Half (controllable memory): ZB-V's placement, one repeating block per microbatch; "
       "(P+2)/2 microbatches of activations, about half of 1F1B's; bubble about 7/12 of 1F1B's",
       without_chunks<make_v_half>},
      {"v-min", 2, 2, 2,
       "V-Min (controllable memory): the tightest V block; (P+4)/3 microbatches of activations, "
       "about a third of 1F1B's; bubble about 2/3 of 1F1B's",
       without_chunks<make_v_min>},
      {"dualpipev", 2, 2, 2,
       "DualPipeV: torch.distributed.pipelining's ScheduleDualPipeV order, forwards and "
       "backwards of the two stages paired in OVERLAP_F_B actions; M >= 2P",
       without_chunks<make_dualpipev>},
      {"chimera", 1, 1, 1,
       "Chimera: two pipelines in opposite directions, stage s on ranks s and P-1-s, half the "
       "microbatches each way; bubble (P-2) max(F, B) per P microbatches; P even, M a "
       "multiple of P",
       without_chunks<make_chimera>},
      {"gems", 1, 1, 1,
       "GEMS: Chimera's two replicas, one microbatch in flight per direction; 2 microbatches of "
       "activations, bubble ratio (P-2)/P; P and M even",
       without_chunks<make_gems>},
      async_1f1b("pipedream",
                 "PipeDream (async): 1F1B without flush, an optimizer step after every "
                 "microbatch, weight stashing (stage s keeps P-s versions); --vertical-sync: P "
                 "versions everywhere",
                 WeightUpdate::kPipeDream),
      async_1f1b("2bw",
                 "PipeDream-2BW (async): 1F1B without flush, step k's gradients taken on the "
                 "weights of step k-1; 2 versions per stage",
                 WeightUpdate::kTwoBW),
      async_1f1b("pipemare",
                 "PipeMare (async): 1F1B without flush, no stash (1 version): the backward reruns "
                 "the forward on the newest weights, corrected by the recent updates; per-stage "
                 "learning rate",
                 WeightUpdate::kPipeMare),
      {"avgpipe", 1, 1, 1,
       "AvgPipe (async across copies): --dp D pipelines, each 1F1B with a flush, that combine "
       "no gradients; every --avg-interval steps elastic averaging pulls their weights together",
       [](const ScheduleOptions& o) {
         Schedule schedule = make_1f1b(o.ranks, o.microbatches);
         schedule.name = "avgpipe";
         return schedule;
       },
       WeightUpdate::kFlush, /*averages_copies=*/true},
      {"wpipe", 2, 2, 2,
       "WPipe (async): two groups of stages interleaved on every rank (stage s on rank s mod "
       "P); the first as 2bw (2 versions), running the next step's forwards early, the second "
       "on fresh weights (1 version); the groups step alternately",
       [](const ScheduleOptions& o) {
         return make_wpipe(o.ranks, o.microbatches, o.period > 0 ? o.period : o.microbatches);
       },
       WeightUpdate::kWPipe},
      async_1f1b("ampnet",
                 "AMPNet (async): 1F1B without flush, no stash (1 version), a step after every "
                 "--update-interval backwards; forward and backward each on the newest weights",
                 WeightUpdate::kAmpNet),
      async_1f1b("spectrain",
                 "SpecTrain (async): 1F1B without flush, a step after every microbatch; forward "
                 "and backward on weights predicted along the optimizer's smoothed direction",
                 WeightUpdate::kSpecTrain),
      async_1f1b("xpipe",
                 "XPipe (async): 1F1B without flush, a step per mini-batch; forward and backward "
                 "on weights predicted once per mini-batch along the optimizer's direction",
                 WeightUpdate::kXPipe),
  };
  return entries;
}

const ScheduleEntry& find_schedule(const std::string& name) {
  for (const auto& entry : schedule_registry()) {
    if (entry.name == name) return entry;
  }
  throw UserError(unknown_schedule_text(name) + " (expected one of: " + schedule_names_text() +
                  ")");
}

std::string unknown_schedule_text(const std::string& name) {
  return "unknown schedule '" + name + "'";
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& entry : schedule_registry()) names.push_back(entry.name);
  return names;
}

std::string schedule_names_text() {
  std::string text;
  for (const auto& name : schedule_names()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

std::string schedule_help_text() {
  std::string text;
  for (const auto& e : schedule_registry()) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-17s chunks %-16s %s\n", e.name.c_str(),
                  chunks_text(e).c_str(), e.summary.c_str());
    text += line;
  }
  return text;
}

std::string schedule_table_markdown() {
  std::string text = "| schedule | chunks per rank | what it is |\n| --- | --- | --- |\n";
  for (const auto& e : schedule_registry()) {
    text += "| `" + e.name + "` | " + chunks_text(e) + " | " + e.summary + " |\n";
  }
  return text;
}

int resolve_chunks(const ScheduleEntry& entry, int requested) {
  PPTRAIN_CHECK(requested >= 0, "schedule '", entry.name,
                "': chunks must be >= 0 (0 = default), got ", requested);
  const int chunks = requested == 0 ? entry.default_chunks : requested;
  if (entry.min_chunks == entry.max_chunks) {
    PPTRAIN_CHECK(chunks == entry.min_chunks, "schedule '", entry.name, "' runs ", entry.min_chunks,
                  " chunk(s) per rank, got chunks=", chunks);
  } else {
    PPTRAIN_CHECK(
        chunks >= entry.min_chunks && (entry.max_chunks == 0 || chunks <= entry.max_chunks),
        "schedule '", entry.name, "' needs chunks ", chunks_text(entry),
        " (stages per rank), got chunks=", chunks);
  }
  return chunks;
}

void check_schedule_size(int ranks, int chunks, long long microbatches,
                         const std::string& microbatches_flag) {
  PPTRAIN_CHECK(ranks <= kMaxRanks, "--pp ", ranks, " is more than the ", kMaxRanks,
                " ranks pptrain plans for");
  const long long pairs = static_cast<long long>(ranks) * chunks * microbatches;
  PPTRAIN_CHECK(pairs <= kMaxStageMicrobatches, microbatches_flag, " ", microbatches, " on ",
                static_cast<long long>(ranks) * chunks, " stages makes ", pairs,
                " stage-microbatches, more than the ", kMaxStageMicrobatches,
                " pptrain plans in one schedule");
}

VersionRule version_rule_of(const std::string& name, bool vertical_sync, int stages,
                            int microbatches) {
  VersionRule rule;
  rule.stages = stages;
  rule.microbatches_per_step = microbatches;
  if (!name.empty()) rule.update = find_schedule(name).update;
  PPTRAIN_CHECK(!vertical_sync || rule.update == WeightUpdate::kPipeDream,
                "--vertical-sync applies to --schedule pipedream only, not '",
                name.empty() ? "a schedule file" : name, "'");
  if (vertical_sync) rule.update = WeightUpdate::kVerticalSync;
  PPTRAIN_CHECK(
      rule.fits_1f1b(), name, " on ", stages, " stages needs --microbatches >= ", stages - 1,
      " (its first stage runs that many forwards ahead into the next step), got ", microbatches);
  return rule;
}

ScheduleSolver parse_solver(const std::string& name) {
  if (name == "heuristic") return ScheduleSolver::kHeuristic;
  PPTRAIN_CHECK(name == "ilp", "--solver must be heuristic or ilp, got '", name, "'");
  return ScheduleSolver::kIlp;
}

const char* solver_name(ScheduleSolver solver) {
  return solver == ScheduleSolver::kIlp ? "ilp" : "heuristic";
}

void check_solver_applies(ScheduleSolver solver, const std::string& schedule) {
  PPTRAIN_CHECK(solver == ScheduleSolver::kHeuristic || schedule == "zb-auto",
                "--solver ilp applies to --schedule zb-auto only, not ",
                schedule.empty() ? std::string("an imported schedule") : "'" + schedule + "'");
}

Schedule make_schedule(const ScheduleOptions& o) {
  const ScheduleEntry& entry = find_schedule(o.name);
  check_solver_applies(o.solver, entry.name);
  const int chunks = resolve_chunks(entry, o.chunks);
  check_schedule_size(o.ranks, chunks, o.microbatches);
  ScheduleOptions resolved = o;
  resolved.chunks = chunks;
  return entry.make(resolved);
}

}  // namespace pptrain
