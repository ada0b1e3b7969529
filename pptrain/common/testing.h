// Test helpers for every room (not installed).
//
//   EXPECT_EQ(pptrain::testing::user_error_of([] { parse("{"); }), "x: not valid JSON: ...");
#pragma once

#include <string>

#include "pptrain/common/check.h"

namespace pptrain::testing {

// The message of the UserError `call` throws, or "" when it throws none.
template <typename Call>
std::string user_error_of(Call call) {
  try {
    call();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace pptrain::testing
