// printf's formatting appended to a string, for the summaries and tables the commands print.
//
//   std::string out;
//   append_format(out, "%3d  %-16s  %9.3f\n", rank, name.c_str(), ms);
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

#include "pptrain/common/check.h"

namespace pptrain {

// Appends `format` filled in with the arguments, of any length.
__attribute__((format(printf, 2, 3))) inline void append_format(std::string& out,
                                                                const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  PPTRAIN_ASSERT(n >= 0, "a format that printf refuses: ", format);
  const size_t start = out.size();
  out.resize(start + n + 1);
  std::vsnprintf(&out[start], n + 1, format, again);
  va_end(again);
  out.resize(start + n);
}

}  // namespace pptrain
