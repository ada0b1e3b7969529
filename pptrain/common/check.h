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

namespace detail {
// `text` safe to print however untrusted its bytes (a file's cell, a JSON parser's excerpt):
// control and non-ASCII bytes become \xNN (a newline stays: a schedule error's grid follows its
// message line), and a line longer than kMaxLine is cut, ending in "...".
inline std::string printable(const std::string& text) {
  constexpr size_t kMaxLine = 400;
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  size_t line = 0;  // bytes of the current output line
  bool cut = false;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte == '\n') {
      out += '\n';
      line = 0;
      cut = false;
    } else if (line >= kMaxLine) {
      if (!cut) out += "...";
      cut = true;
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += c;
      line += 1;
    } else {
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
      line += 4;
    }
  }
  return out;
}
}  // namespace detail

// A mistake in the user's input. The message names the bad value and what was expected; any
// untrusted bytes in it are escaped and long lines cut (detail::printable).
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(detail::printable(message)) {}
};

// An error raised by the user's own module code (a Python forward, say), already worded for
// the user: passed on as it is, not taken for a problem with the stage's input.
class ModuleError : public UserError {
 public:
  using UserError::UserError;
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

// A place the code never reaches (the default of a switch that covers every case): throws
// InternalError with the message, and the compiler knows nothing follows it at any -O level.
#define PPTRAIN_UNREACHABLE(...)  \
  throw ::pptrain::InternalError( \
      ::pptrain::detail::concat(__FILE__, ":", __LINE__, ": internal error: ", ##__VA_ARGS__))
