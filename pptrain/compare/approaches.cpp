#include "pptrain/compare/approaches.h"

#include <cctype>
#include <sstream>

#include "pptrain/common/check.h"

namespace pptrain {
namespace detail {
extern const char kSurveyApproachesCsv[];  // approaches_data.cpp, made from the data file
}  // namespace detail

namespace {

constexpr const char* kHeader =
    "approach,schedule,dp,survey_schedule,convergence,extra_memory,extra_compute,"
    "extra_communication";
constexpr size_t kColumns = 8;

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  std::stringstream in(text);
  std::string piece;
  while (std::getline(in, piece, separator)) pieces.push_back(piece);
  return pieces;
}

// One row's cells as an Approach; `where` names the line in messages.
Approach parse_row(const std::string& line, const std::string& where) {
  std::vector<std::string> cells = split(line, ',');
  if (!line.empty() && line.back() == ',') cells.emplace_back();  // getline drops the last ""
  PPTRAIN_CHECK(cells.size() == kColumns, where, ": expected ", kColumns, " cells (", kHeader,
                "), got ", cells.size());
  Approach a;
  a.name = cells[0];
  a.schedule = cells[1];
  PPTRAIN_CHECK(!a.name.empty() && !a.schedule.empty(), where,
                ": the approach and its schedule must not be empty");
  PPTRAIN_CHECK(cells[2] == "1" || cells[2] == "2", where,
                ": dp must be 1 or 2 (--batch-size is checked for 2 copies), got '", cells[2], "'");
  a.dp = cells[2] == "2" ? 2 : 1;
  PPTRAIN_CHECK(cells[3] == "Sync" || cells[3] == "Async", where,
                ": survey_schedule must be Sync or Async, got '", cells[3], "'");
  a.survey_sync = cells[3] == "Sync";
  a.survey_convergence = cells[4];
  bool* marks[] = {&a.survey_extra_memory, &a.survey_extra_compute, &a.survey_extra_comm};
  for (size_t k = 0; k < 3; ++k) {
    const std::string& mark = cells[5 + k];
    PPTRAIN_CHECK(mark.empty() || mark == "X", where, ": an extra_* cell is X or empty, got '",
                  mark, "'");
    *marks[k] = mark == "X";
  }
  return a;
}

}  // namespace

std::vector<Approach> parse_approaches(const std::string& csv, const std::string& source) {
  std::vector<Approach> table;
  bool header_seen = false;
  int number = 0;
  for (std::string line : split(csv, '\n')) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = source + " line " + std::to_string(number);
    if (!header_seen) {
      PPTRAIN_CHECK(line == kHeader, where, ": expected the header '", kHeader, "', got '", line,
                    "'");
      header_seen = true;
      continue;
    }
    table.push_back(parse_row(line, where));
  }
  PPTRAIN_CHECK(!table.empty(), source, ": no approach (expected the header '", kHeader,
                "' and a row per approach)");
  return table;
}

const std::vector<Approach>& survey_approaches() {
  static const std::vector<Approach> table =
      parse_approaches(detail::kSurveyApproachesCsv, "data/survey/approaches.csv");
  return table;
}

std::vector<Approach> select_approaches(const std::vector<Approach>& table,
                                        const std::optional<std::string>& only) {
  if (!only) return table;
  PPTRAIN_CHECK(!only->empty(),
                "--only: no approach named (give a comma list, e.g. 1f1b,pipedream)");
  std::vector<bool> wanted(table.size(), false);
  for (const std::string& piece : split(*only, ',')) {
    bool found = false;
    for (size_t i = 0; i < table.size(); ++i) {
      if (lower(piece) == lower(table[i].name) || piece == table[i].schedule) {
        wanted[i] = found = true;
      }
    }
    if (!found) {
      std::string names;
      for (const Approach& a : table) {
        names += (names.empty() ? "" : ", ") + a.name + " (" + a.schedule + ")";
      }
      PPTRAIN_CHECK(false, "--only: unknown approach '", piece, "' (expected a comma list of ",
                    names, ")");
    }
  }
  PPTRAIN_CHECK(only->back() != ',', "--only: empty name in '", *only, "'");
  std::vector<Approach> selected;
  for (size_t i = 0; i < table.size(); ++i) {
    if (wanted[i]) selected.push_back(table[i]);
  }
  return selected;
}

}  // namespace pptrain
