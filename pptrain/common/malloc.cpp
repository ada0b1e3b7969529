#include "pptrain/common/malloc.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
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

}  // namespace pptrain
