#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/common/malloc.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
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

// Prints "pptrain: <kind>: rank R: <message>" (see rank_prefix) and returns `exit_code`.
int report(const char* kind, const std::string& message, int exit_code) {
  std::fprintf(stderr, "pptrain: %s: %s%s\n", kind, rank_prefix(message).c_str(), message.c_str());
  return exit_code;
}

}  // namespace

int run_cli(CLI::App& app, int argc, char** argv) {
  try {
    // Both programs free and allocate the same large sizes pass after pass (the planner's tables,
    // a step's tensors): kept in the heap, the next ones reuse their pages.
    keep_freed_memory();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other flag error is one line and exit status 2.
    if (e.get_exit_code() == 0) return app.exit(e);
    return report("error", e.what() + std::string(" (see --help)"), 2);
  } catch (const pptrain::UserError& e) {
    return report("error", e.what(), 2);
  } catch (const pptrain::InternalError& e) {
    return report("internal error", first_line(e.what()), 1);
  } catch (const std::exception& e) {  // a failure of the run: communication, a file system, ...
    return report("error", first_line(e.what()), 1);
  }
  return 0;
}

}  // namespace pptrain::cli
