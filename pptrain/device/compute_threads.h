// How many threads compute a process's matrix products.
//
//   set_compute_threads(1);   // a pipeline worker, the profiler: one core each
//
// LibTorch's torch::set_num_threads does not reach OpenBLAS's own pool, so without this a
// process would quietly use every core for its matrix products: a --pp 1 run would get more cores
// than each worker, and the profiler's thread CPU time would miss the work done on OpenBLAS's
// other threads (a d_model 256 gpt block measured about 30% below its one-thread cost).
#pragma once

namespace pptrain {

// Sets LibTorch's intra-op threads and, when the process uses OpenBLAS, OpenBLAS's. OpenBLAS is
// looked up at run time, so no particular BLAS is linked.
void set_compute_threads(int threads);

// CPU time of the calling thread, in ms. With one compute thread (autograd runs a CPU backward
// on the calling thread too) the difference around a computation is its compute time, and
// unlike wall time it does not grow when other processes share the cores.
double thread_cpu_ms();

}  // namespace pptrain
