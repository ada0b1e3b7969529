#include "pptrain/runtime/local_ranks.h"

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/launcher.h"

namespace pptrain {

void run_local_ranks(int ranks, const std::function<void(int rank, Transport& transport)>& body,
                     const std::string& what) {
  const int port = find_free_port();
  std::mutex failed_mutex;
  std::string failed;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        TransportOptions options;
        options.rank = rank;
        options.world_size = ranks;
        options.master_port = port;
        options.timeout = std::chrono::seconds(60);
        options.heartbeat = false;
        auto transport = connect_transport(options);
        body(rank, *transport);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failed_mutex);
        if (failed.empty()) failed = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  PPTRAIN_CHECK(failed.empty(), what, " failed: ", failed);
}

}  // namespace pptrain
