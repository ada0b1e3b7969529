// glibc's malloc kept from handing freed memory back to the kernel, for programs that free and
// allocate the same large sizes over and over: a training step's tensors, the planner's tables of
// one pass after another's; and `pptrain schedule`'s heap in huge pages.
#pragma once

namespace pptrain {

// Makes glibc's malloc keep the memory the process frees for its next allocations instead of
// handing it back to the kernel: blocks up to 32 MiB come from the heap rather than from a mapping
// of their own, and the heap is not trimmed. With glibc's defaults many large blocks are fresh
// mappings whose pages the kernel must zero on first touch (gpt 8x256 at pp 2: a tenth of a
// step's time, more in a Python process; `pptrain schedule` zb-v P=64: 8%; see
// docs/PERFORMANCE.md). The price: the process keeps its peak heap until it exits.
// Leaves malloc alone when the environment sets glibc's own malloc settings (GLIBC_TUNABLES with
// glibc.malloc.*, or MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_ /
// MALLOC_MMAP_MAX_) or PPTRAIN_MALLOC=system (PPTRAIN_MALLOC=pptrain is the default; another
// value is a UserError). Idempotent; returns whether the settings are pptrain's (false on a
// system without glibc).
bool keep_freed_memory();

// Asks the kernel to back the next 256 MiB of the heap with huge pages (2 MiB, transparent; it
// does where THP is "madvise" or "always"), after keep_freed_memory() (which it calls): a large
// table then costs a page fault per 2 MiB rather than per 4 KiB, and its passes fewer misses of
// the TLB (`pptrain schedule` zb-v P=256 M=2048: 15% faster, P=32 M=256: 0.2 ms slower; see
// docs/PERFORMANCE.md). Called by `pptrain schedule`, whose memory is a few large tables; not by
// `plan`, whose huge pages came fresh late in the run and cost more than they saved on a virtual
// machine, nor by the runtime, whose heap holds tensors. Idempotent; returns whether the heap was
// advised (false where keep_freed_memory() is not in effect, or the heap could not grow).
bool heap_in_huge_pages();

}  // namespace pptrain
