#include "pptrain/common/malloc.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "pptrain/common/check.h"

namespace pptrain {

namespace {

bool user_set_malloc() {
  if (const char* choice = std::getenv("PPTRAIN_MALLOC"); choice && *choice) {
    const std::string value = choice;
    PPTRAIN_CHECK(value == "system" || value == "pptrain", "PPTRAIN_MALLOC must be 'pptrain' or ",
                  "'system', got '", value, "'");
    if (value == "system") return true;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return true;
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_MMAP_MAX_"}) {
    if (std::getenv(name)) return true;
  }
  return false;
}

}  // namespace

bool keep_freed_memory() {
  static const bool kept = [] {
    if (user_set_malloc()) return false;
#ifdef __GLIBC__
    // The largest threshold glibc accepts on a 64-bit system; either call also turns off glibc's
    // own adjustment of the two, which only raises the threshold after a mapping is freed.
    constexpr int kMmapThreshold = 32 << 20;
    return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
           mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
    return false;
#endif
  }();
  return kept;
}

bool heap_in_huge_pages() {
  static const bool advised = [] {
#ifdef __GLIBC__
    if (!keep_freed_memory()) return false;
    // malloc grows the heap by what a block needs plus M_TOP_PAD: one block that does not fit
    // grows it by the whole reserve at once, and the blocks after it are carved from there.
    constexpr int kReserve = 256 << 20;
    constexpr int kGlibcTopPad = 128 << 10;  // M_TOP_PAD's default, for any growth after
    constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
    const uintptr_t start = reinterpret_cast<uintptr_t>(sbrk(0));
    if (mallopt(M_TOP_PAD, kReserve) != 1) return false;
    void* volatile block = std::malloc(kHugePage);  // volatile: the pair is not optimized away
    std::free(block);
    mallopt(M_TOP_PAD, kGlibcTopPad);
    const uintptr_t end = reinterpret_cast<uintptr_t>(sbrk(0));
    const uintptr_t from = (start + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t to = end & ~(kHugePage - 1);
    return to > from && madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE) == 0;
#else
    return false;
#endif
  }();
  return advised;
}

}  // namespace pptrain
