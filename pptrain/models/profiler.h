// Per-layer profiler: runs each layer of a model alone (one thread) and measures what the
// partitioner needs. `pptrain profile` is a thin wrapper around it.
//
//   ProfileOptions options;  options.model.kind = "mlp";
//   ModelProfile profile = profile_model(options);
//   write_profile_json(profile, "profile.json");   // format "pptrain-profile-1"
//
// Each layer gets a real input of the right shape: the layers run in sequence on a random batch,
// so layer i's input is layer i-1's output. Times are medians over `iters` after `warmup`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pptrain/models/model.h"

namespace pptrain {

struct ProfileOptions {
  ModelOptions model;
  int microbatch_size = 4;  // samples per microbatch
  int warmup = 3;           // unmeasured iterations per layer
  int iters = 10;           // measured iterations per layer (median reported)
};

struct LayerProfile {
  std::string name;
  double forward_ms = 0;          // F
  double backward_input_ms = 0;   // I: backward with weight-gradient deferral on
  double backward_weight_ms = 0;  // W: running the deferred closures
  int64_t activation_bytes = 0;   // bytes of the layer's output (what a cut after it sends)
  int64_t stash_bytes = 0;        // bytes the layer keeps from F for its backward
  int64_t parameter_bytes = 0;    // bytes of its parameters
};

struct ModelProfile {
  ProfileOptions options;
  int threads = 1;
  std::string hostname;
  int cpus = 0;
  std::string torch_version;
  std::vector<LayerProfile> layers;
};

// UserError on bad options. Sets torch's thread count to 1 for the measurement.
ModelProfile profile_model(const ProfileOptions& options);

nlohmann::json to_json(const ModelProfile& profile);
// UserError if the file cannot be written.
void write_profile_json(const ModelProfile& profile, const std::string& path);

}  // namespace pptrain
