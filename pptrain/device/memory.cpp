#include "pptrain/device/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/malloc.h"

namespace pptrain {

namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_window_peak{0};

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}
std::atomic<bool> g_installed{false};

// Blocks of at least kCachedFrom bytes (header included) are mappings of their own, kept when
// freed for the next block of the same mapped size, as long as pptrain's malloc settings are in
// effect (keep_freed_memory(), common/malloc.h). A step allocates the same sizes microbatch after
// microbatch and step after step, so after the first step its large tensors reuse pages that are
// already there (no fault, no zeroing by the kernel), as in glibc's kept heap; but a freed block
// is not a hole in a heap that blocks of other sizes split and pin, so the resident set stays
// closer to what the tensors hold (docs/PERFORMANCE.md: GPipe's last stage 5% lower, 1F1B's 12%).
// A block that waited a whole step without being taken is given back at the next step's start
// (release_unused_blocks()), so sizes that stop coming (a shape that changed) do not pile up.
constexpr size_t kCachedFrom = size_t{1} << 20;

class BlockCache {
 public:
  // A block of `bytes` (a multiple of the page size): the one of that size kept last, else a
  // fresh mapping.
  char* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto kept = by_size_.find(bytes);
      if (kept != by_size_.end() && !kept->second.empty()) {
        const auto newest = kept->second.back();
        kept->second.pop_back();
        char* block = newest->block;
        order_.erase(newest);
        cached_ -= bytes;
        return block;
      }
    }
    void* block =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(block != MAP_FAILED, "pptrain's CPU allocator: cannot map ", bytes,
                " bytes: ", std::strerror(errno));
    return static_cast<char*>(block);
  }

  // Keeps a block for the next take() of its size.
  void give(char* block, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    by_size_[bytes].push_back(order_.insert(order_.end(), Kept{block, bytes, generation_}));
    cached_ += bytes;
  }

  // Unmaps the blocks kept before the last call that no take() has used since; a new generation.
  void release_unused() {
    std::vector<Kept> unmap;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!order_.empty() && order_.front().generation < generation_) {
        const Kept oldest = order_.front();
        auto& same = by_size_[oldest.bytes];
        same.erase(same.begin());  // a size's oldest block is the first it kept
        order_.pop_front();
        cached_ -= oldest.bytes;
        unmap.push_back(oldest);
      }
      ++generation_;
    }
    for (const Kept& k : unmap) ::munmap(k.block, k.bytes);
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  struct Kept {
    char* block;
    size_t bytes;
    int64_t generation;  // of the release_unused() calls, when it was kept
  };
  std::mutex mutex_;
  std::list<Kept> order_;  // kept first at the front
  std::unordered_map<size_t, std::vector<std::list<Kept>::iterator>> by_size_;
  size_t cached_ = 0;
  int64_t generation_ = 0;
};

BlockCache& block_cache() {
  // Leaked on purpose: blocks are freed until exit. A fork() holds its lock, so that a child
  // (a data loader's worker) does not inherit it held by a thread the child does not have.
  static auto* cache = [] {
    auto* made = new BlockCache;
    ::pthread_atfork([] { block_cache().lock(); }, [] { block_cache().unlock(); },
                     [] { block_cache().unlock(); });
    return made;
  }();
  return *cache;
}

size_t mapped_size(size_t bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Each counted block carries in a header in front of the data its size and, for a block of the
// cache, its mapped size (0 for the wrapped allocator's), so the data pointer can also be the
// deleter's context: LibTorch's raw_allocate() (used by some kernels) requires that. 64 bytes
// keep the data as aligned as the wrapped allocator made the block.
constexpr size_t kHeaderBytes = 64;
struct Header {
  int64_t bytes;
  size_t mapped;
};
static_assert(sizeof(Header) <= kHeaderBytes);
c10::DeleterFnPtr g_inner_deleter = nullptr;

void delete_counted(void* data) {
  char* block = static_cast<char*>(data) - kHeaderBytes;
  Header header;
  std::memcpy(&header, block, sizeof(header));
  g_allocated.fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.mapped) {
    block_cache().give(block, header.mapped);
  } else {
    g_inner_deleter(block);
  }
}

class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    Header header{static_cast<int64_t>(n), 0};
    char* block = nullptr;
    c10::Device device(c10::DeviceType::CPU);
    if (n + kHeaderBytes >= kCachedFrom && keep_freed_memory()) {
      header.mapped = mapped_size(n + kHeaderBytes);
      block = block_cache().take(header.mapped);
    } else {
      c10::DataPtr inner = inner_->allocate(n + kHeaderBytes);
      device = inner.device();
      TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context(),
                            "wrapped allocator's block has a context");
      block = static_cast<char*>(inner.release_context());
    }
    std::memcpy(block, &header, sizeof(header));
    char* data = block + kHeaderBytes;
    const int64_t now =
        g_allocated.fetch_add(header.bytes, std::memory_order_relaxed) + header.bytes;
    raise_to(g_peak, now);
    raise_to(g_window_peak, now);
    return c10::DataPtr(data, data, &delete_counted, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    // Only an allocator whose blocks free through one plain function can be wrapped this way
    // (LibTorch's default CPU allocator can); otherwise memory is simply not measured.
    g_inner_deleter = inner->raw_deleter();
    if (!g_inner_deleter) return;
    // Leaked on purpose: tensors may be freed through it until the process exits.
    static auto* counting = new CountingAllocator(inner);
    // A priority above the default registration so the swap takes effect.
    c10::SetCPUAllocator(counting, /*priority=*/100);
    g_installed = true;
  });
}

bool counting_allocator_installed() {
  return g_installed;
}
int64_t cached_block_bytes() {
  return static_cast<int64_t>(block_cache().cached());
}
void release_unused_blocks() {
  block_cache().release_unused();
}
int64_t allocated_bytes() {
  return g_allocated.load(std::memory_order_relaxed);
}
int64_t peak_bytes() {
  return g_peak.load(std::memory_order_relaxed);
}
void reset_peak() {
  g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}
int64_t window_peak_bytes() {
  return g_window_peak.load(std::memory_order_relaxed);
}
void reset_window_peak() {
  g_window_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

int64_t uncounted_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::Storage& storage = t.storage();
    if (!seen.insert(storage.unsafeGetStorageImpl()).second) continue;
    if (storage.data_ptr().get_deleter() != &delete_counted) {
      bytes += static_cast<int64_t>(storage.nbytes());
    }
  }
  return bytes;
}

int64_t resident_bytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (!statm) return 0;
  long long pages = 0, resident = 0;
  const int read = std::fscanf(statm, "%lld %lld", &pages, &resident);
  std::fclose(statm);
  return read == 2 ? resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace pptrain
