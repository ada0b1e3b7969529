#include "pptrain/schedule/schedule.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> stages;
  for (int s = 0; s < num_stages; ++s) {
    if (stage_to_rank[s] == rank) stages.push_back(s);
  }
  return stages;
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
      for (const auto& part : a.parts) {
        if (part.op == Op::I || part.op == Op::W) return true;
      }
    }
  }
  return false;
}

bool Schedule::operator==(const Schedule& other) const {
  return num_ranks == other.num_ranks && num_stages == other.num_stages &&
         num_microbatches == other.num_microbatches && stage_to_rank == other.stage_to_rank &&
         actions == other.actions && flushes == other.flushes;
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

// A map, not a vector sized by the largest index: a typo like `999999999F0` must be an error
// message, not a 4 GB table.
void note_stage(std::map<int, int>& stage_to_rank, int stage, int rank, int row) {
  const auto [it, inserted] = stage_to_rank.emplace(stage, rank);
  PPTRAIN_CHECK(inserted || it->second == rank, "schedule row ", row, ": stage ", stage,
                " also appears on rank ", it->second, " (a stage must live on one rank)");
}

}  // namespace

Schedule parse_csv(const std::string& text, const std::string& name) {
  Schedule schedule;
  schedule.name = name;
  std::istringstream in(text);
  std::string line;
  int max_microbatch = -1;
  std::map<int, int> stage_to_rank;
  while (std::getline(in, line)) {
    const int rank = static_cast<int>(schedule.actions.size());
    const int row = rank + 1;
    std::vector<Action> list;
    const auto cells = split_cells(line);
    for (size_t col = 0; col < cells.size(); ++col) {
      if (cells[col].find_first_not_of(" \t") == std::string::npos) continue;  // idle step
      Action a;
      try {
        a = parse_action(cells[col]);
      } catch (const UserError& e) {
        throw UserError("schedule row " + std::to_string(row) + " cell " + std::to_string(col + 1) +
                        ": " + e.what());
      }
      const auto& atoms = a.op == Op::OVERLAP_F_B ? a.parts : std::vector<Action>{a};
      for (const auto& atom : atoms) {
        max_microbatch = std::max(max_microbatch, atom.microbatch);
        note_stage(stage_to_rank, atom.stage, rank, row);
      }
      list.push_back(std::move(a));
    }
    schedule.actions.push_back(std::move(list));
  }
  // Trailing empty lines are not ranks.
  while (!schedule.actions.empty() && schedule.actions.back().empty()) schedule.actions.pop_back();
  schedule.num_ranks = static_cast<int>(schedule.actions.size());
  PPTRAIN_CHECK(schedule.num_ranks > 0, "schedule file has no actions");
  int expected = 0;
  for (const auto& [stage, rank] : stage_to_rank) {
    PPTRAIN_CHECK(stage == expected, "schedule has no action for stage ", expected,
                  " (stages must be numbered 0..", stage_to_rank.size() - 1, ", but ", stage,
                  " appears)");
    schedule.stage_to_rank.push_back(rank);
    ++expected;
  }
  schedule.num_stages = static_cast<int>(schedule.stage_to_rank.size());
  schedule.num_microbatches = max_microbatch + 1;
  PPTRAIN_CHECK(schedule.num_stages % schedule.num_ranks == 0, "schedule has ", schedule.num_stages,
                " stages on ", schedule.num_ranks,
                " ranks; every rank must hold the same number of stages");
  return schedule;
}

Schedule read_schedule_csv(const std::string& path) {
  return parse_csv(read_text_file(path, "schedule file"));
}

void write_schedule_csv(const Schedule& schedule, const std::string& path) {
  write_text_file(path, to_csv(schedule), "schedule file");
}

Schedule lower(const Schedule& schedule) {
  if (schedule.has_comms()) return schedule;
  Schedule out = schedule;
  const auto& placement = schedule.stage_to_rank;
  for (int r = 0; r < schedule.num_ranks; ++r) {
    std::vector<Action> lowered;
    for (const Action& a : schedule.actions[r]) {
      // Receives first: everything the (possibly composite) action consumes from other ranks.
      for (const Action& atom : atoms_of(a)) {
        for (const Need& need : inputs_of(atom, placement, /*lowered=*/true)) {
          if (need.fact == Fact::kReceivedF || need.fact == Fact::kReceivedB) {
            lowered.push_back(producer_of(need));
          }
        }
      }
      lowered.push_back(a);
      for (const Action& atom : atoms_of(a)) {
        if (const auto send = send_after(atom, placement)) lowered.push_back(*send);
      }
    }
    out.actions[r] = std::move(lowered);
  }
  return out;
}

}  // namespace pptrain
