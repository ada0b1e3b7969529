// Test helpers for the runtime room: the ranks of a world as threads of the test process.
//
//   auto transports = make_loopback_transports(2);
//   EXPECT_EQ(run_rank_threads(2, [&](int rank) { ... transports[rank] ... }), "");
//
// An exception thrown by a rank is caught in its thread and reported, never std::terminate.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pptrain::testing {

// Runs rank_main(r) for r = 0 .. world_size-1, each on its own thread, and waits for all of them.
// Returns "" when every rank returned normally, else one line "rank r: <what()>" per rank that
// threw.
inline std::string run_rank_threads(int world_size, const std::function<void(int)>& rank_main) {
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&rank_main, &errors, rank] {
      try {
        rank_main(rank);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      } catch (...) {
        errors[rank] = "an exception that is not a std::exception";
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::string report;
  for (int rank = 0; rank < world_size; ++rank) {
    if (!errors[rank].empty())
      report += "rank " + std::to_string(rank) + ": " + errors[rank] + "\n";
  }
  return report;
}

}  // namespace pptrain::testing
