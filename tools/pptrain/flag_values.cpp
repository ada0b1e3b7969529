// Values of the planner commands' list flags (`--replicas 3,1`, `--microbatches 4,8,16`,
// `--schedules 1f1b,zb-v`), the --profile option they share and the schedule families' options;
// commands.h declares them.
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

void add_family_flags(CLI::App* command, FamilyValues& values) {
  for (const FamilyOption* option : family_options()) {
    const std::string flag = option->flag;
    switch (option->kind) {
      case FamilyOption::Kind::kSwitch:
        command->add_flag_callback(
            flag, [&values, flag] { values[flag] = true; }, option->help);
        break;
      case FamilyOption::Kind::kInt:
        command->add_option_function<int>(
            flag, [&values, flag](const int& v) { values[flag] = v; }, option->help);
        break;
      case FamilyOption::Kind::kNumber:
        command->add_option_function<double>(
            flag, [&values, flag](const double& v) { values[flag] = v; }, option->help);
        break;
    }
  }
}

}  // namespace pptrain::cli
