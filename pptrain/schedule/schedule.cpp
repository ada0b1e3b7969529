#include "pptrain/schedule/schedule.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"

namespace pptrain {

std::vector<int> Schedule::replicas_of(int stage) const {
  if (placement.empty()) return {stage_to_rank[stage]};
  std::vector<int> ranks = placement[stage];
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> stages;
  for (int s = 0; s < num_stages; ++s) {
    const bool held = placement.empty() ? stage_to_rank[s] == rank
                                        : std::find(placement[s].begin(), placement[s].end(),
                                                    rank) != placement[s].end();
    if (held) stages.push_back(s);
  }
  return stages;
}

int Schedule::skip_index(int a, int b) const {
  const SkipLink link{std::min(a, b), std::max(a, b)};
  const auto it = std::lower_bound(skips.begin(), skips.end(), link);
  return it != skips.end() && *it == link ? static_cast<int>(it - skips.begin()) : -1;
}

bool Schedule::has_comms() const {
  for (const auto& list : actions) {
    for (const auto& a : list) {
      if (is_comm(a.op)) return true;
    }
  }
  return false;
}

bool Schedule::has_split_backward() const {
  for (const auto& list : actions) {
    for (const auto& a : list) {
      if (a.op == Op::I || a.op == Op::W) return true;
      for (const auto& part : a.parts()) {
        if (part.op == Op::I || part.op == Op::W) return true;
      }
    }
  }
  return false;
}

bool Schedule::operator==(const Schedule& other) const {
  return num_ranks == other.num_ranks && num_stages == other.num_stages &&
         num_microbatches == other.num_microbatches && stage_to_rank == other.stage_to_rank &&
         placement == other.placement && skips == other.skips && actions == other.actions &&
         flushes == other.flushes;
}

Schedule without_actions(const Schedule& schedule) {
  Schedule out;
  out.name = schedule.name;
  out.num_ranks = schedule.num_ranks;
  out.num_stages = schedule.num_stages;
  out.num_microbatches = schedule.num_microbatches;
  out.stage_to_rank = schedule.stage_to_rank;
  out.actions.resize(schedule.actions.size());
  out.flushes = schedule.flushes;
  out.placement = schedule.placement;
  out.skips = schedule.skips;
  return out;
}

Schedule strip_comms(const Schedule& schedule) {
  Schedule out = schedule;
  for (auto& list : out.actions) {
    list.erase(
        std::remove_if(list.begin(), list.end(), [](const Action& a) { return is_comm(a.op); }),
        list.end());
  }
  return out;
}

std::string to_csv(const Schedule& schedule) {
  std::string text;
  for (const auto& list : schedule.actions) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) text += ',';
      text += to_string(list[i]);
    }
    text += '\n';
  }
  return text;
}

namespace {

// Splits one CSV line into cells. Our cells never hold commas or quotes; a quoted cell (as a
// spreadsheet may write) is unquoted.
std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (char c : line) {
    if (c == ',') {
      cells.push_back(cell);
      cell.clear();
    } else if (c != '"' && c != '\r') {
      cell += c;
    }
  }
  cells.push_back(cell);
  return cells;
}

// torch's lowering (_add_unshard_reshard) writes `<stage>UNSHARD` before a stage's first action
// and `<stage>RESHARD` after its last: FSDP's all-gather of the stage's parameters and their
// release. pptrain's stages hold their parameters whole, so such a cell is dropped on import, as an
// empty one is; a stage number must lead it.
bool is_fsdp_cell(std::string_view cell) {
  while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
  size_t digits = 0;
  while (digits < cell.size() && cell[digits] >= '0' && cell[digits] <= '9') ++digits;
  const std::string_view op = cell.substr(digits);
  return digits > 0 && (op == "UNSHARD" || op == "RESHARD");
}

// Where the actions of a CSV file are: maps, not vectors sized by the largest index, so that a
// typo like `999999999F0` is an error message, not a 4 GB table.
struct CsvPlaces {
  std::map<std::pair<int, int>, int> of_pair;  // (stage, microbatch) -> rank
  std::map<int, std::set<int>> of_stage;       // stage -> ranks holding any of its microbatches
  std::map<int, std::set<int>> reductions;     // stage -> ranks with its REDUCE_GRAD
  std::set<SkipLink> skips;                    // of the skip messages

  void note(const Action& atom, int rank, int row) {
    if (atom.op == Op::REDUCE_GRAD) {
      reductions[atom.stage].insert(rank);
      return;
    }
    if (is_skip_message(atom)) {
      skips.insert({std::min(atom.stage, atom.peer), std::max(atom.stage, atom.peer)});
    }
    const auto [it, inserted] = of_pair.emplace(std::make_pair(atom.stage, atom.microbatch), rank);
    PPTRAIN_CHECK(inserted || it->second == rank, "schedule row ", row, ": stage ", atom.stage,
                  " also appears on rank ", it->second, " for microbatch ", atom.microbatch,
                  " (a stage runs each microbatch on one rank)");
    of_stage[atom.stage].insert(rank);
  }
};

}  // namespace

Schedule parse_csv(const std::string& text, const std::string& name) {
  Schedule schedule;
  schedule.name = name;
  std::istringstream in(text);
  std::string line;
  int max_microbatch = -1;
  CsvPlaces places;
  while (std::getline(in, line)) {
    const int rank = static_cast<int>(schedule.actions.size());
    const int row = rank + 1;
    std::vector<Action> list;
    const auto cells = split_cells(line);
    for (size_t col = 0; col < cells.size(); ++col) {
      if (cells[col].find_first_not_of(" \t") == std::string::npos) continue;  // idle step
      if (is_fsdp_cell(cells[col])) continue;
      Action a;
      try {
        a = parse_action(cells[col]);
      } catch (const UserError& e) {
        throw UserError("schedule row " + std::to_string(row) + " cell " + std::to_string(col + 1) +
                        ": " + e.what());
      }
      for (const Action& atom : atoms_of(a)) {
        max_microbatch = std::max(max_microbatch, atom.microbatch);
        places.note(atom, rank, row);
      }
      list.push_back(std::move(a));
    }
    schedule.actions.push_back(std::move(list));
  }
  // Trailing empty lines are not ranks.
  while (!schedule.actions.empty() && schedule.actions.back().empty()) schedule.actions.pop_back();
  schedule.num_ranks = static_cast<int>(schedule.actions.size());
  PPTRAIN_CHECK(schedule.num_ranks > 0, "schedule file has no actions");
  // A stage's ranks: those of its microbatches, or of its reduction when it has none.
  std::map<int, std::set<int>> stages = places.reductions;
  for (const auto& [stage, ranks] : places.of_stage) stages[stage] = ranks;
  bool replicated = false;
  int expected = 0;
  for (const auto& [stage, ranks] : stages) {
    PPTRAIN_CHECK(stage == expected, "schedule has no action for stage ", expected,
                  " (stages must be numbered 0..", stages.size() - 1, ", but ", stage, " appears)");
    for (int rank : places.reductions[stage]) {
      PPTRAIN_CHECK(ranks.count(rank), "schedule row ", rank + 1, ": ", stage,
                    "REDUCE_GRAD is on a rank that runs no microbatch of stage ", stage);
    }
    replicated = replicated || ranks.size() > 1;
    schedule.stage_to_rank.push_back(*ranks.begin());
    ++expected;
  }
  schedule.num_stages = static_cast<int>(schedule.stage_to_rank.size());
  schedule.num_microbatches = max_microbatch + 1;
  schedule.skips.assign(places.skips.begin(), places.skips.end());
  if (!replicated) {
    PPTRAIN_CHECK(schedule.num_stages % schedule.num_ranks == 0, "schedule has ",
                  schedule.num_stages, " stages on ", schedule.num_ranks,
                  " ranks; every rank must hold the same number of stages");
    return schedule;
  }
  // The placement table has a cell per (stage, microbatch): refuse one the file cannot fill
  // (a typo such as 0F999999999 on two rows), as the validator does.
  const long long cells =
      static_cast<long long>(schedule.num_stages) * static_cast<long long>(max_microbatch + 1);
  PPTRAIN_CHECK(cells <= 2 * static_cast<long long>(places.of_pair.size()) + 1024,
                "schedule places ", places.of_pair.size(), " (stage, microbatch) pairs for ",
                schedule.num_stages, " stages and ", max_microbatch + 1,
                " microbatches; expected one for every stage and microbatch");
  // A pair without actions takes the stage's first replica; the validator names it as missing.
  schedule.placement.assign(schedule.num_stages, std::vector<int>(schedule.num_microbatches, 0));
  for (int s = 0; s < schedule.num_stages; ++s) {
    for (int m = 0; m < schedule.num_microbatches; ++m) {
      const auto it = places.of_pair.find({s, m});
      schedule.placement[s][m] =
          it == places.of_pair.end() ? schedule.stage_to_rank[s] : it->second;
    }
  }
  return schedule;
}

int Schedule::chunks() const {
  if (!replicated()) return num_ranks ? num_stages / num_ranks : 0;
  if (num_microbatches == 0 || num_stages == 0) return 1;
  std::set<int> passed;
  for (int stage = 0; stage < num_stages; ++stage) passed.insert(placement[stage][0]);
  return num_stages / static_cast<int>(passed.size());
}

Schedule read_schedule_csv(const std::string& path) {
  return parse_csv(read_text_file(path, "schedule file"));
}

void write_schedule_csv(const Schedule& schedule, const std::string& path) {
  write_text_file(path, to_csv(schedule), "schedule file");
}

}  // namespace pptrain
