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
#include "pptrain/partition/profile.h"  // LayerProfile: one per-layer cost type, shared with the partitioners

namespace pptrain {

struct ProfileOptions {
  ModelOptions model;
  int microbatch_size = 4;  // samples per microbatch
  int warmup = 3;           // unmeasured iterations per layer
  int iters = 10;           // measured iterations per layer (median reported)
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
