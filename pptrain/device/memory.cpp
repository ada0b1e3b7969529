#include "pptrain/device/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "pptrain/common/check.h"

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

// Each counted block carries its size in a header in front of the data, so the data pointer can
// also be the deleter's context: LibTorch's raw_allocate() (used by some kernels) requires that.
// 64 bytes keep the data as aligned as the wrapped allocator made the block.
constexpr size_t kHeaderBytes = 64;
c10::DeleterFnPtr g_inner_deleter = nullptr;

void delete_counted(void* data) {
  char* block = static_cast<char*>(data) - kHeaderBytes;
  int64_t bytes = 0;
  std::memcpy(&bytes, block, sizeof(bytes));
  g_allocated.fetch_sub(bytes, std::memory_order_relaxed);
  g_inner_deleter(block);
}

class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n + kHeaderBytes);
    const c10::Device device = inner.device();
    TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context(),
                          "wrapped allocator's block has a context");
    char* block = static_cast<char*>(inner.release_context());
    const int64_t bytes = static_cast<int64_t>(n);
    std::memcpy(block, &bytes, sizeof(bytes));
    char* data = block + kHeaderBytes;
    const int64_t now = g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
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
