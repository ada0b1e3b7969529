// What one worker process can do here: how fast it multiplies matrices and how much memory its
// control group lets it hold. `pptrain train --partition workers` runs both on every rank at
// once (job/worker_speeds.h) and cuts the model so that a slower rank gets fewer layers.
//
//   double rate = matrix_product_rate(std::chrono::milliseconds(800));   // products per second
//   double limit = cgroup_memory_limit_bytes();                          // 0: none
#pragma once

#include <chrono>

namespace pptrain {

// Products of two 256 x 256 fp32 matrices this process completes per second of wall-clock time,
// counted over `window`. Wall time, not CPU time: a process held to a share of a core by the CPU
// controller of cgroups (cpu.cfs_quota_us, cpu.max), or sharing its core with another, computes
// at full speed between pauses, so only a window of several scheduler periods (100 ms each by
// default) sees the rate it really gets.
double matrix_product_rate(std::chrono::milliseconds window);

// The memory limit of this process's cgroup (v2 memory.max, v1 memory.limit_in_bytes), in bytes;
// 0 when there is none or it cannot be read.
double cgroup_memory_limit_bytes();

}  // namespace pptrain
