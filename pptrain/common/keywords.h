// A command-line flag's Python keyword, by one rule for every surface: pptrain.train()'s
// keywords are `pptrain train`'s flags, and the schedule families' options (generators/registry.h)
// are keywords of pptrain.schedule() and pptrain.plan.schedule() the same way.
//
//   keyword_of("--batch-size") == "batch_size"
#pragma once

#include <algorithm>
#include <string>

namespace pptrain {

// The flag without its leading dashes, '_' for each '-'.
inline std::string keyword_of(const std::string& flag_name) {
  const size_t first = flag_name.find_first_not_of('-');
  std::string out = first == std::string::npos ? std::string() : flag_name.substr(first);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

}  // namespace pptrain
