#include "pptrain/common/once.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace pptrain {
namespace {

// Threads that ask together: the work runs once, and every caller returns after it finished.
TEST(Once, WorkRunsOnceAndEveryCallerSeesItDone) {
  for (int round = 0; round < 50; ++round) {
    Once once;
    std::atomic<int> runs{0};
    std::atomic<bool> finished{false};
    std::atomic<int> saw_unfinished{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        once.call([&] {
          ++runs;
          std::this_thread::yield();
          finished = true;
        });
        if (!finished) ++saw_unfinished;
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(runs, 1);
    EXPECT_EQ(saw_unfinished, 0);
  }
}

// As with std::call_once, work that throws leaves it not done: the next call runs it again.
TEST(Once, WorkThatThrowsRunsAgain) {
  Once once;
  int runs = 0;
  EXPECT_THROW(once.call([&] {
    ++runs;
    throw std::runtime_error("refused");
  }),
               std::runtime_error);
  once.call([&] { ++runs; });
  once.call([&] { ++runs; });
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace pptrain
