#include "pptrain/device/memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "pptrain/common/malloc.h"

namespace pptrain {
namespace {

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Rounds of what a step does to malloc: many blocks of 1 MiB taken, written and all given back.
// glibc's defaults map the first round's blocks, then take later rounds' from the heap but trim
// the heap when they are freed, so every round faults its pages in again; with keep_freed_memory
// only the first round does.
TEST(KeepFreedMemory, LaterRoundsReuseTheFirstRoundsPages) {
  const bool kept = keep_freed_memory();
  if (!kept) GTEST_SKIP() << "the environment chose its own malloc settings";
  constexpr size_t kBlock = 1 << 20;
  constexpr int kBlocks = 32;
  constexpr int64_t kPagesPerRound = kBlocks * (kBlock / 4096);
  auto round = [&] {
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(std::malloc(kBlock));
      ASSERT_NE(blocks.back(), nullptr);
      std::memset(blocks.back(), i + 1, kBlock);
    }
    for (void* block : blocks) std::free(block);
  };
  round();  // the first touch of the pages
  const int64_t before = minor_faults();
  for (int i = 0; i < 4; ++i) round();
  const int64_t faults = minor_faults() - before;
  EXPECT_LT(faults, kPagesPerRound / 10)
      << faults << " page faults in 4 rounds of " << kPagesPerRound << " pages";
  EXPECT_TRUE(keep_freed_memory());  // idempotent
}

}  // namespace
}  // namespace pptrain
