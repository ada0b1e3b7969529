// Work done once by whichever thread asks first, the others waiting for it: std::call_once's
// rule, without its cost where the planner makes hundreds of such entries. glibc's call_once
// (pthread_once) ends each first call with a futex wake, a system call whether or not a thread
// waits; here a first call takes an uncontended mutex, and every later one reads a flag.
//
//   Once once;
//   once.call([&] { table = build(); });   // any thread, any number of times: build() runs once
//
// As with call_once, a call that throws leaves it not done: the next call tries again.
#pragma once

#include <atomic>
#include <mutex>

namespace pptrain {

class Once {
 public:
  template <typename Work>
  void call(Work&& work) {
    if (done_.load(std::memory_order_acquire)) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    work();
    done_.store(true, std::memory_order_release);
  }

 private:
  std::atomic<bool> done_{false};
  std::mutex mutex_;
};

}  // namespace pptrain
