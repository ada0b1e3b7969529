#include "pptrain/generators/registry.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

std::string chunks_text(const ScheduleEntry& e) {
  if (e.min_chunks == e.max_chunks) return std::to_string(e.min_chunks);
  const std::string range = e.max_chunks
                                ? std::to_string(e.min_chunks) + "-" + std::to_string(e.max_chunks)
                                : ">= " + std::to_string(e.min_chunks);
  return range + " (default " + std::to_string(e.default_chunks) + ")";
}

}  // namespace

const WeightRule& find_weight_rule(const std::string& name) {
  if (name == synchronous_rule().name()) return synchronous_rule();
  for (const auto& entry : schedule_registry()) {
    if (name == entry.update->name()) return *entry.update;
    for (const WeightRule* rule : entry.other_rules) {
      if (name == rule->name()) return *rule;
    }
  }
  throw UserError("unknown weight rule '" + name + "'");
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

std::vector<const FamilyOption*> family_options() {
  std::vector<const FamilyOption*> all;
  std::set<std::string> seen;
  for (const auto& entry : schedule_registry()) {
    for (const FamilyOption& option : entry.options) {
      if (seen.insert(option.flag).second) all.push_back(&option);
    }
  }
  return all;
}

void check_family_options(const FamilyValues& given, const std::string& schedule) {
  const ScheduleEntry* entry = schedule.empty() ? nullptr : &find_schedule(schedule);
  for (const auto& [flag, value] : given) {
    std::string owners;
    for (const auto& e : schedule_registry()) {
      for (const FamilyOption& option : e.options) {
        if (option.flag == flag) owners += (owners.empty() ? "" : ", ") + e.name;
      }
    }
    PPTRAIN_CHECK(!owners.empty(), "unknown family option ", flag);
    const FamilyOption* own = nullptr;
    for (size_t i = 0; entry && i < entry->options.size(); ++i) {
      if (entry->options[i].flag == flag) own = &entry->options[i];
    }
    PPTRAIN_CHECK(own, flag, " applies to --schedule ", owners, " only, not '",
                  entry ? schedule : "a schedule file", "'");
    const bool is_switch = std::holds_alternative<bool>(value);
    PPTRAIN_CHECK(is_switch == (own->kind == FamilyOption::Kind::kSwitch), flag,
                  is_switch ? " takes a value, not a switch" : " is a switch (true or false)");
    if (own->kind == FamilyOption::Kind::kSwitch) continue;
    PPTRAIN_CHECK(own->kind != FamilyOption::Kind::kInt || std::holds_alternative<int>(value), flag,
                  " takes a whole number");
    std::ostringstream got;
    std::visit([&got](auto v) { got << v; }, value);
    const double v = std::visit([](auto x) { return static_cast<double>(x); }, value);
    if (std::isinf(own->max)) {
      PPTRAIN_CHECK(v >= own->min, flag, " must be >= ", own->min, ", got ", got.str());
    } else {
      PPTRAIN_CHECK(v >= own->min && v < own->max, flag, " must be in [", own->min, ", ", own->max,
                    "), got ", got.str());
    }
  }
}

bool family_switch(const FamilyValues& given, const std::string& flag) {
  const auto it = given.find(flag);
  return it != given.end() && std::get<bool>(it->second);
}

int family_int(const FamilyValues& given, const std::string& flag, int otherwise) {
  const auto it = given.find(flag);
  return it == given.end() ? otherwise : std::get<int>(it->second);
}

double family_number(const FamilyValues& given, const std::string& flag, double otherwise) {
  const auto it = given.find(flag);
  if (it == given.end()) return otherwise;
  const int* whole = std::get_if<int>(&it->second);
  return whole ? *whole : std::get<double>(it->second);
}

VersionRule version_rule_of(const std::string& name, int stages, int microbatches,
                            const FamilyValues& given) {
  check_family_options(given, name);
  VersionRule rule;
  rule.stages = stages;
  rule.microbatches_per_step = microbatches;
  const ScheduleEntry* entry = name.empty() ? nullptr : &find_schedule(name);
  if (entry) rule.update = entry->update;
  if (entry && entry->configure_rule) entry->configure_rule(given, rule);
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
