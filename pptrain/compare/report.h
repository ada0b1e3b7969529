// What `pptrain compare` writes of a comparison (comparison.h): OUT/compare.md (the command,
// the configuration, the table beside the survey's marks and where the two disagree),
// OUT/compare.json (the same data; an absent figure is null) and OUT/losses.svg (every run's
// loss per step, the --pp 1 run dashed; render/line_chart.h).
//
//   CompareResult result = run_compare(options);
//   for (const std::string& path : write_compare_files(result)) std::puts(path.c_str());
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pptrain/compare/comparison.h"

namespace pptrain {

std::string compare_markdown(const CompareResult& result);
nlohmann::ordered_json compare_json(const CompareResult& result);
std::string compare_losses_svg(const CompareResult& result);

// Writes the three files into result.options.out and returns their paths (.md, .json, .svg).
// UserError naming the file when one cannot be written.
std::vector<std::string> write_compare_files(const CompareResult& result);

}  // namespace pptrain
