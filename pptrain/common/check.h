// Errors and checks shared by every room.
//
// Two kinds of checks, as in LibTorch:
//   PPTRAIN_CHECK(cond, parts...)  - a user's mistake (bad flag, bad file, impossible parameters).
//                                    Throws pptrain::UserError; `main` prints it on one line and
//                                    exits with status 2.
//   PPTRAIN_ASSERT(cond, parts...) - one of our own invariants. Throws pptrain::InternalError.
//
//   PPTRAIN_CHECK(microbatches >= 1, "--microbatches must be >= 1, got ", microbatches);
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pptrain {

// A mistake in the user's input. The message names the bad value and what was expected.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken invariant inside pptrain: a bug, not a user mistake.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace pptrain

#define PPTRAIN_CHECK(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) throw ::pptrain::UserError(::pptrain::detail::concat(__VA_ARGS__)); \
  } while (false)

#define PPTRAIN_ASSERT(cond, ...)                                                     \
  do {                                                                                \
    if (!(cond))                                                                      \
      throw ::pptrain::InternalError(::pptrain::detail::concat(                       \
          __FILE__, ":", __LINE__, ": internal error: ", #cond, " ", ##__VA_ARGS__)); \
  } while (false)
