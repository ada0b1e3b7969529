#include "pptrain/common/malloc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace pptrain {
namespace {

// A mapping of this process (/proc/self/smaps): its range, flags and huge pages.
struct Mapping {
  uintptr_t begin = 0, end = 0;
  bool huge_advised = false;  // VmFlags has "hg" (madvise(MADV_HUGEPAGE))
  long anon_huge_kib = 0;     // AnonHugePages
  bool holds(const void* address) const {
    const auto at = reinterpret_cast<uintptr_t>(address);
    return begin <= at && at < end;
  }
};

std::vector<Mapping> mappings() {
  std::vector<Mapping> all;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 &&
        line.find(':') > line.find(' ')) {  // a range line, not a "Name: value" one
      all.push_back(Mapping{begin, end});
    } else if (all.empty()) {
      continue;
    } else if (line.rfind("AnonHugePages:", 0) == 0) {
      all.back().anon_huge_kib = std::atol(line.c_str() + std::strlen("AnonHugePages:"));
    } else if (line.rfind("VmFlags:", 0) == 0) {
      all.back().huge_advised = (line + " ").find(" hg ") != std::string::npos;
    }
  }
  return all;
}

// The mapping advised for huge pages (there is one once the heap is): empty if there is none.
Mapping advised_mapping() {
  for (const Mapping& mapping : mappings()) {
    if (mapping.huge_advised) return mapping;
  }
  return {};
}

bool kernel_offers_huge_pages() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(file, modes);
  return modes.find("[always]") != std::string::npos ||
         modes.find("[madvise]") != std::string::npos;
}

// The heap grown by the reserve and advised: a block malloc'd afterwards lies in the advised
// mapping and, once written, is backed by huge pages.
TEST(HeapInHugePages, BlocksAfterwardsGetHugePages) {
  if (!kernel_offers_huge_pages()) GTEST_SKIP() << "this kernel gives no transparent huge pages";
  if (!heap_in_huge_pages()) {
    ASSERT_FALSE(keep_freed_memory()) << "the heap was not advised, with pptrain's malloc settings";
    GTEST_SKIP() << "the environment chose its own malloc settings";
  }
  EXPECT_TRUE(heap_in_huge_pages());  // idempotent
  const Mapping before = advised_mapping();
  ASSERT_GE(before.end - before.begin, uintptr_t{200} << 20) << "no advised reserve of 256 MiB";
  constexpr size_t kBlock = size_t{8} << 20;
  char* block = static_cast<char*>(std::malloc(kBlock));
  ASSERT_NE(block, nullptr);
  // Its middle: the reserve starts at the first 2 MiB boundary of the new heap, and the block
  // may start before it. Blocks freed by earlier tests of this process may be reused from below.
  const char* middle = block + kBlock / 2;
  if (!before.holds(middle)) {
    std::free(block);
    GTEST_SKIP() << "the block came from heap memory this process had before the reserve";
  }
  volatile char* written = block;  // volatile: the writes to a block freed unread stay
  for (size_t i = 0; i < kBlock; i += 4096) written[i] = 1;
  const Mapping after = advised_mapping();
  std::free(block);
  // At least the 2 MiB pages wholly inside the block's part in the reserve (the kernel may lack
  // a free one: rare).
  EXPECT_GE(after.anon_huge_kib - before.anon_huge_kib, 2 << 10);
}

}  // namespace
}  // namespace pptrain
