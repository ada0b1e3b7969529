// Counts the bytes LibTorch holds on the CPU, to measure a step's peak activation memory.
//
// install_counting_allocator() wraps LibTorch's CPU allocator once per process; from then on
// every CPU tensor allocation is counted (tensors allocated before are not). The runtime calls
// reset_peak() at the start of a step and reports peak_bytes() - bytes at the step start: what
// the step allocated on top of the weights, gradients and optimizer state that persist across
// steps, i.e. stashed activations, temporaries and communication buffers.
//
//   install_counting_allocator();
//   auto base = allocated_bytes(); reset_peak();
//   ... run a step ...
//   int64_t activation_peak = peak_bytes() - base;
//
// The counts are process-wide, not per thread: a tensor is often freed on another thread than
// the one that allocated it (a loopback message is copied by its sender and freed by its
// receiver), so per-thread counts would drift. Ranks run as threads of one process (the loopback
// tests) therefore share one count; only a one-rank-per-process run measures a rank's own peak.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace pptrain {

// Idempotent; safe to call from any thread before or after tensors exist. With pptrain's malloc
// settings in effect (keep_freed_memory(), common/malloc.h) the allocator also keeps the large
// blocks (1 MiB and more) that tensors free, each a mapping of its own, for the next tensor of the
// same size: a step's large tensors reuse the last step's pages without the holes a heap keeps.
void install_counting_allocator();
bool counting_allocator_installed();
int64_t cached_block_bytes();  // bytes of freed large blocks kept for reuse
// Gives back the kept blocks that no tensor took since the last call (the runtime calls it at
// every step's start: what waited a whole step is not coming back, such as a shape that changed).
void release_unused_blocks();
int64_t allocated_bytes();  // bytes currently held through the counting allocator
int64_t peak_bytes();       // highest allocated_bytes() since the last reset_peak()
void reset_peak();          // peak := current
// A second peak with its own reset, for a part of a step (one action) without disturbing the
// step's: the highest allocated_bytes() since the last reset_window_peak().
int64_t window_peak_bytes();
void reset_window_peak();
// Bytes of the distinct storages among `tensors` that the counting allocator did not allocate
// (made before it was installed): what allocated_bytes() misses of them. A rank adds those of its
// parameters, which a program may have built before its pipeline started.
int64_t uncounted_bytes(const std::vector<torch::Tensor>& tensors);

// The process's resident memory (RSS, from /proc/self/statm): everything it holds in RAM, LibTorch
// and its libraries included; 0 where it cannot be read. What a leak check watches over a long
// run.
int64_t resident_bytes();

// Bytes of a tensor's elements; 0 for an undefined tensor.
inline int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace pptrain
