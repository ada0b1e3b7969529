// The schedule registry: the one list of schedules pptrain can generate by name.
//
// Each entry says what the schedule is called, how many stages per rank it runs by default and
// which it accepts, what it is in one line, and how to make it. `--schedule` checks names
// against it, `--help` and `pptrain schedule --list` (which the README's table is checked
// against) print it. Each family of schedules states its entries (generator, summary, chunks) and
// its weight rule in its own file of generators/families/; the registry lists the families.
//
//   Schedule s = make_schedule({"1f1b", /*ranks=*/4, /*microbatches=*/8});
//   Schedule z = make_schedule({"zb-v", 4, 8});   // chunks 0: the entry's default (2)
//   const ScheduleEntry& e = find_schedule("zb-h1");   // UserError listing the names if unknown
//
//   ScheduleOptions o{"zb-auto", 4, 8};     // an automatic schedule also reads costs and a limit
//   o.costs = cost_model.stage_costs(4, 4); o.memory_limit = 4;
//   Schedule a = make_schedule(o);
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "pptrain/generators/auto_schedule.h"
#include "pptrain/generators/ilp_schedule.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/weight_versions.h"

namespace pptrain {

// How zb-auto orders the actions: the paper's greedy (auto_schedule.h), or its integer program
// solved by CBC and warm-started from the greedy (ilp_schedule.h). `--solver heuristic|ilp`.
enum class ScheduleSolver { kHeuristic, kIlp };

// "heuristic" -> kHeuristic, "ilp" -> kIlp; UserError naming the value and both names otherwise.
ScheduleSolver parse_solver(const std::string& name);
const char* solver_name(ScheduleSolver solver);
// UserError (one line) when `solver` is the ILP and `schedule` (a registry name, "" for an
// imported file) is not zb-auto: only zb-auto is solved.
void check_solver_applies(ScheduleSolver solver, const std::string& schedule);

struct ScheduleOptions {
  std::string name;      // a registry name: "gpipe", "1f1b", "interleaved-1f1b", ...
  int ranks = 1;         // P >= 1
  int microbatches = 1;  // M >= 1
  int chunks = 0;        // V: stages per rank; 0 = the schedule's default
  // What an automatic schedule (zb-auto) plans for; the other generators ignore both.
  // costs: per-stage F, I, W times, activations and comm (CostModel::stage_costs() in
  // sim/cost_model.h makes them); empty: every F, I, W 1, comm 0, activation 1, r = 0.5.
  StageCosts costs = {};
  // Cap on every rank's peak, in the memory model's units (auto_schedule.h); 0: none. A
  // hand-written schedule is checked against it after simulation (sim/simulator.h), not here.
  double memory_limit = 0;
  // Optional, zb-auto only: a cap per rank [P] in the same units, 0 for none on that rank; when
  // non-empty it replaces memory_limit (the planner's bytes beside each rank's own weights).
  std::vector<double> rank_memory_limits = {};
  // An asynchronous run's list covers several steps: the microbatches of one step (its
  // optimizer period). 0: all of them. Read by the generators whose order depends on it (wpipe).
  int period = 0;
  // zb-auto only (any other schedule refuses kIlp): the solver, and the ILP's time limit, seconds.
  ScheduleSolver solver = ScheduleSolver::kHeuristic;
  double time_limit_s = 60;
  // Optional: receives what the ILP did (kIlp only); not owned.
  IlpReport* ilp_report = nullptr;
  // 1f1b-rr only (ScheduleEntry::takes_replicas): the replicas of each stage, on consecutive
  // ranks, `ranks` in all ({3, 1}: 4 ranks); empty: one each.
  std::vector<int> replicas = {};
};

// An option a family adds to a training run: a flag of `pptrain train` and, by the same list, a
// keyword of Python's pptrain.train() (job/train_args.h). Given for a schedule of another family
// or out of its range, it is a one-line error (check_family_options below).
struct FamilyOption {
  enum class Kind { kSwitch, kInt, kNumber };
  std::string flag;  // "--pipemare-warmup"
  std::string help;  // for --help, starting with the family's name
  Kind kind = Kind::kSwitch;
  // A given value must be >= min, and < max when max is finite (kInt, kNumber).
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};

// The family options given for a run, by flag: a switch given is true.
using FamilyValue = std::variant<bool, int, double>;
using FamilyValues = std::map<std::string, FamilyValue>;

struct ScheduleEntry {
  std::string name;
  int default_chunks = 1;  // V when ScheduleOptions::chunks is 0
  int min_chunks = 1;      // the V it accepts: min_chunks .. max_chunks
  int max_chunks = 1;      // 0: no upper bound
  std::string summary;     // one line, for --help and the README
  // Builds the schedule for the options, `chunks` already resolved and in range.
  std::function<Schedule(const ScheduleOptions& options)> make;
  // How the weights are updated: the synchronous rule, or an asynchronous family's (no flush),
  // whose `make` marks the schedule with flushes = false.
  const WeightRule* update = &synchronous_rule();
  // True when the --dp copies of the pipeline combine no gradients: each trains on its own
  // share of the batch and they pull their weights together every --avg-interval steps
  // (elastic averaging, train/stage_copies.h). Each pipeline itself flushes.
  bool averages_copies = false;
  // True when the stages' replica counts come with the request (ScheduleOptions::replicas:
  // --replicas, or a pipedream partition's): 1f1b-rr.
  bool takes_replicas = false;
  // Whether `pptrain plan` searches it (a synchronous schedule). Not 1f1b-rr, which is 1f1b
  // there (the planner's partitions have one replica per stage), nor bitpipe while the
  // planner's costs leave out what each action costs beyond its compute (docs/CLI.md).
  bool planned = true;
  // The rules besides `update` that the family's options may switch the entry to (in
  // configure_rule), so that find_weight_rule() knows them by name.
  std::vector<const WeightRule*> other_rules = {};
  // The options of the entry's family (FamilyOption above).
  std::vector<FamilyOption> options = {};
  // Sets what the family's options say in the rule (an update interval, another of its rules);
  // unset: nothing.
  std::function<void(const FamilyValues& given, VersionRule& rule)> configure_rule = {};

  bool asynchronous() const { return update->asynchronous(); }
};

// Every schedule, in a stable order (the order of --help and the README); families/families.cpp
// lists the families, so that this room's registry needs none of them.
const std::vector<ScheduleEntry>& schedule_registry();
// The weight rule called `name` ("flush", or an entry's `update` or `other_rules` by its
// name()); UserError naming it if there is none.
const WeightRule& find_weight_rule(const std::string& name);
// The entry called `name`; UserError naming it and listing every name if there is none.
const ScheduleEntry& find_schedule(const std::string& name);
// "unknown schedule 'NAME'": how find_schedule()'s error begins, by which `pptrain compare`
// knows a training binary that was built without a schedule.
std::string unknown_schedule_text(const std::string& name);
// The registry's names, in its order.
std::vector<std::string> schedule_names();
// "gpipe, 1f1b, interleaved-1f1b, ..." for messages.
std::string schedule_names_text();
// One line per schedule for --help: "  1f1b              1 chunk    <summary>".
std::string schedule_help_text();
// The README's table (markdown): | schedule | chunks (default) | what it is |.
std::string schedule_table_markdown();

// The chunks a schedule runs for a requested count (0 = the entry's default); UserError naming
// the entry's range if it does not run that many.
int resolve_chunks(const ScheduleEntry& entry, int requested);

// The largest schedules pptrain plans: more would take gigabytes before anything useful
// happens. One list holds at most kMaxStageMicrobatches (stage, microbatch) pairs, each a few
// actions (an asynchronous run counts every step's microbatches).
constexpr int kMaxRanks = 1024;
constexpr long long kMaxStageMicrobatches = 1 << 20;

// UserError (one line, naming the flags) when P ranks x V chunks x M microbatches is beyond the
// limits above. `microbatches_flag` names what M came from in the message.
void check_schedule_size(int ranks, int chunks, long long microbatches,
                         const std::string& microbatches_flag = "--microbatches");

// Every family option of the registry, once each, in the registry's order (they live as long as
// the registry: the program).
std::vector<const FamilyOption*> family_options();
// UserError (one line naming the flag) when a given option is not one of `schedule`'s family
// ("" for a schedule file: none is), has a value of another kind (a switch is a bool, a count an
// int, a number an int or a double), or is out of its range.
void check_family_options(const FamilyValues& given, const std::string& schedule);
// A given option's value, or `otherwise` when it was not given.
bool family_switch(const FamilyValues& given, const std::string& flag);
int family_int(const FamilyValues& given, const std::string& flag, int otherwise);
double family_number(const FamilyValues& given, const std::string& flag, double otherwise);

// The weight rule of running `name` ("" for an imported file: synchronous) on `stages` stages
// with `microbatches` per step, with the family options `given` checked (check_family_options)
// and then set in the rule by the entry's configure_rule. UserError naming the option for one
// of another family, or when the rule does not fit the 1F1B order (2bw with fewer than S-1
// microbatches per step).
VersionRule version_rule_of(const std::string& name, int stages, int microbatches,
                            const FamilyValues& given = {});

// Builds the named schedule: resolves chunks (0 = default), checks it against the entry, then
// calls its generator with the options (chunks resolved). UserError naming the bad value for an
// unknown name or impossible parameters (P < 1, M < 1, chunks out of range, the generator's own
// conditions).
Schedule make_schedule(const ScheduleOptions& options);

}  // namespace pptrain
