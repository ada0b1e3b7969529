// The survey's table of pipeline approaches as `pptrain compare` runs them: one row per
// approach with how pptrain trains it and the survey's own marks. The table is the data file
// data/survey/approaches.csv, compiled in (an installed program needs no data folder).
//
//   for (const Approach& a : survey_approaches()) ...             // the 14 rows, in order
//   std::vector<Approach> some = select_approaches(survey_approaches(), "1f1b,PipeDream");
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pptrain {

struct Approach {
  std::string name;                // the survey's: "DAPPLE"
  std::string schedule;            // pptrain train --schedule: "1f1b"
  int dp = 1;                      // pptrain train --dp (copies of the pipeline)
  bool survey_sync = true;         // the survey's Schedule column: Sync (true) or Async
  std::string survey_convergence;  // the survey's Convergence column: "Excellent", ...
  bool survey_extra_memory = false, survey_extra_compute = false, survey_extra_comm = false;
};

// The rows of a table in approaches.csv's format: lines starting with '#' and blank lines
// skipped, then the header line, then one row per approach (docs in the file). UserError naming
// `source`, the line and what was expected for anything else.
std::vector<Approach> parse_approaches(const std::string& csv, const std::string& source);

// data/survey/approaches.csv as this program was built with it.
const std::vector<Approach>& survey_approaches();

// The rows `only` names, in the table's order: a comma list of survey names (any case) or
// schedules; nullopt for every row. UserError naming --only for an unknown or empty name.
std::vector<Approach> select_approaches(const std::vector<Approach>& table,
                                        const std::optional<std::string>& only);

}  // namespace pptrain
