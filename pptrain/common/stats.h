// Small statistics over measurements.
//
//   double ms = median(step_times);   // 0 for none
#pragma once

#include <algorithm>
#include <vector>

namespace pptrain {

// The middle value (the mean of the two middle ones for an even count); 0 for no values.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace pptrain
