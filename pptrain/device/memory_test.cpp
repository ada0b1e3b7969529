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

// A large tensor freed leaves its block for the next tensor of the same size; small ones go to
// the wrapped allocator; a block that waited from one release_unused_blocks() to the next without
// being taken is given back.
TEST(CountingAllocator, KeepsLargeBlocksForTheSameSize) {
  if (!keep_freed_memory()) GTEST_SKIP() << "the environment chose its own malloc settings";
  install_counting_allocator();
  release_unused_blocks();
  release_unused_blocks();  // nothing kept from before
  ASSERT_EQ(cached_block_bytes(), 0);
  void* first = nullptr;
  {
    torch::Tensor t = torch::empty({1 << 19});  // 2 MiB
    first = t.data_ptr();
  }
  EXPECT_GE(cached_block_bytes(), int64_t{2} << 20);
  torch::Tensor again = torch::empty({1 << 19});
  EXPECT_EQ(again.data_ptr(), first) << "the freed block was not reused";
  EXPECT_EQ(cached_block_bytes(), 0);
  { torch::Tensor small = torch::empty({1024}); }
  EXPECT_EQ(cached_block_bytes(), 0) << "a 4 KiB tensor was kept";
  again = torch::Tensor();
  const int64_t kept = cached_block_bytes();
  EXPECT_GE(kept, int64_t{2} << 20);
  release_unused_blocks();  // kept during this "step": stays for the next
  EXPECT_EQ(cached_block_bytes(), kept);
  release_unused_blocks();  // a whole step without a taker: given back
  EXPECT_EQ(cached_block_bytes(), 0);
}

}  // namespace
}  // namespace pptrain
