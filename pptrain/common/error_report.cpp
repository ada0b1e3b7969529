#include "pptrain/common/error_report.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// Errors from libraries can carry a backtrace after their message: one line is what a user reads.
std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// "rank 1: " in a worker of a multi-process run (RANK set, WORLD_SIZE above 1), so that every
// rank's error line says whose it is; empty elsewhere, and when `message` already starts with
// this rank ("rank 0 of 2 could not join the rendezvous ...").
std::string rank_prefix(const std::string& message) {
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  const auto digits = [](const char* text) {
    return text && *text && std::strlen(text) < 10 &&
           std::strspn(text, "0123456789") == std::strlen(text);
  };
  if (!digits(rank) || !digits(world) || std::atoi(world) <= 1) return "";
  const std::string own = std::string("rank ") + rank;
  if (message.rfind(own + " ", 0) == 0 || message.rfind(own + ":", 0) == 0) return "";
  return own + ": ";
}

}  // namespace

int report_error(const char* kind, const std::string& message, int exit_code) {
  std::fprintf(stderr, "pptrain: %s: %s%s\n", kind, rank_prefix(message).c_str(), message.c_str());
  return exit_code;
}

int exit_status_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const UserError& e) {
    return report_error("error", e.what(), 2);
  } catch (const InternalError& e) {
    return report_error("internal error", first_line(e.what()), 1);
  } catch (const std::exception& e) {  // a failure of the run: communication, a file system, ...
    return report_error("error", first_line(e.what()), 1);
  }
  return 0;
}

}  // namespace pptrain
