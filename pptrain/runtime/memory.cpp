#include "pptrain/runtime/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>

namespace pptrain {

namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

// What a counted allocation remembers: the wrapped allocator's own pointer, to free it through
// its deleter, and the size to subtract.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void delete_counted(void* context) {
  auto* counted = static_cast<Counted*>(context);
  g_allocated.fetch_sub(counted->bytes, std::memory_order_relaxed);
  delete counted;  // frees `inner` through the wrapped allocator
}

// LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define PPTRAIN_ALLOCATE_CONST
#else
#define PPTRAIN_ALLOCATE_CONST const
#endif

class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) PPTRAIN_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return c10::DataPtr(data, new Counted{std::move(inner), bytes}, &delete_counted, device);
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* inner_;
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: tensors may be freed through it until the process exits.
    static auto* counting = new CountingAllocator(c10::GetCPUAllocator());
    // A priority above the default registration so the swap takes effect.
    c10::SetCPUAllocator(counting, /*priority=*/100);
    g_installed = true;
  });
}

bool counting_allocator_installed() { return g_installed; }
int64_t allocated_bytes() { return g_allocated.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace pptrain
