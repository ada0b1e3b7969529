// Per-layer profiler: runs each layer of a model alone (one thread) and measures what the
// partitioner needs. `pptrain profile` is a thin wrapper around it.
//
//   ProfileOptions options;  options.model.kind = "mlp";
//   ModelProfile profile = profile_model(options);
//   write_profile_json(profile, "profile.json");   // format "pptrain-profile-1"
//
// Each layer gets a real input of the right shape: the layers run in sequence on a random batch,
// so layer i's input is layer i-1's output. Times are medians over `iters` after `warmup`, in
// CPU time of the (single) compute thread, so that other processes on the machine do not inflate
// them (settings.clock = "thread_cpu_time" in the JSON).
//
// What each LayerProfile field means here:
//   forward_ms          F with autograd recording, as in training
//   backward_input_ms   I: output.backward(dY) under DeferWeightGrads (LayerNorm and embedding
//                       weight gradients are still computed here: they have no deferral)
//   backward_weight_ms  W: WeightGradStore::run() for that backward
//   activation_bytes    bytes of the layer's output (what a cut after it sends)
//   stash_bytes         bytes the forward leaves allocated while its output is alive: the saved
//                       intermediates and the output itself (the next layer, or the loss, keeps
//                       it). Measured as the growth of CPU tensor bytes across the forward with
//                       the runtime's counting allocator (device/memory.h), median over the
//                       iterations; the layer's input is not counted (it was allocated before).
//                       Summed over a stage's layers this is the stage's activation memory per
//                       microbatch in flight, apart from the stage input.
//   weight_stash_bytes  of stash_bytes, what W frees: the bytes the deferred weight gradients
//                       held from the end of I (the weight layers' inputs and output gradients),
//                       the gradients zeroed in place as in a run; median over the iterations
//   parameter_bytes     bytes of the layer's parameters
//   forward_transient_bytes, backward_transient_bytes
//                       the most F (and I or W) held above both the bytes it started and ended
//                       with (the counting allocator's window peak), median over the iterations
//   stash_fixed_bytes, forward_transient_fixed_bytes, backward_transient_fixed_bytes
//                       of the three above, the part that does not grow with the samples: each
//                       measured again at one sample, the line through the two sizes' fixed
//                       part (0 when the microbatch is one sample)
// and of the whole model (ModelProfile::input_bytes, target_bytes): one microbatch's inputs and
// targets.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pptrain/common/precision.h"
#include "pptrain/models/model.h"
#include "pptrain/partition/profile.h"  // LayerProfile: one per-layer cost type, shared with the partitioners

namespace pptrain {

struct ProfileOptions {
  ModelOptions model;
  int microbatch_size = 4;  // samples per microbatch
  int warmup = 3;           // unmeasured iterations per layer
  int iters = 10;           // measured iterations per layer (median reported)
  // What the layers compute in, as a run at that precision computes (runtime/stage.h): bf16 and
  // fp16 under autocast, each output in that dtype ("settings": {"precision"} of the JSON).
  Precision precision = Precision::kFp32;
};

struct ModelProfile {
  ProfileOptions options;
  int threads = 1;
  std::string hostname;
  int cpus = 0;
  std::string torch_version;
  std::vector<LayerProfile> layers;
  double input_bytes = 0;  // one microbatch's inputs (layer 0's) and targets (the loss's)
  double target_bytes = 0;
  NetworkProfile network;  // set by the caller (runtime/allreduce_probe.h); written if measured
  // Set by the caller (runtime/overhead_probe.h); written if measured.
  OverheadProfile overheads;
};

// UserError on bad options. Leaves LibTorch and OpenBLAS at one compute thread (the measurement's).
ModelProfile profile_model(const ProfileOptions& options);

nlohmann::json profile_to_json(const ModelProfile& profile);
// UserError if the file cannot be written.
void write_profile_json(const ModelProfile& profile, const std::string& path);

}  // namespace pptrain
