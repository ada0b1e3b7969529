// Values of the planner commands' list flags (`--replicas 3,1`, `--microbatches 4,8,16`,
// `--schedules 1f1b,zb-v`) and the --profile option they share; commands.h declares them.
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "tools/pptrain/commands.h"

namespace pptrain::cli {

std::optional<int> positive_int(const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size() || value < 1) return std::nullopt;
  return value;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    pieces.push_back(text.substr(begin, comma == std::string::npos ? comma : comma - begin));
    if (comma == std::string::npos) return pieces;
    begin = comma + 1;
  }
}

CLI::Option* add_profile_option(CLI::App* command, std::string& path) {
  return command
      ->add_option("--profile", path,
                   "Profile: pptrain JSON (pptrain profile) or PipeDream graph.txt")
      ->required();
}

}  // namespace pptrain::cli
