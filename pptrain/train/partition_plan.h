// Which layers each pipeline stage of a training run holds: `pptrain train --partition`.
//
//   uniform    equal block counts (uniform_split; the default, as before)
//   params     balanced parameter bytes, computed from the model's own layers (no timing)
//   time       profiles every layer on this machine (profiler.h, with the run's microbatch
//              size), then the `time` partitioner (partition.h): the slowest stage's F+I+W is
//              as small as it can be
//   workers    `time` for the workers the run has: every rank measures its own speed, and a
//              slower rank gets fewer layers. Decided by the ranks once they have met
//              (job/worker_speeds.h); the plan before that holds the uniform cut
//   FILE.json  read and decided by content: a partition (`pptrain partition --json`: a
//              "stages" array) is used as it is; a profile (`pptrain profile`: a "layers" array)
//              is partitioned with `time`
//
// The ranges must be the same on every rank, and timings differ between processes, so the
// launching process resolves the partition once and passes the result to its workers as text
// (`--stage-layers 0-2,3-5`). A rank started by torchrun resolves it itself, which is
// deterministic for everything but `time` without a file; that case is refused (may_profile).
//
//   StageLayerOptions options{model, "params"};
//   auto ranges = plan_stage_layers(options, /*num_stages=*/4);    // UserError on bad input
//   format_stage_layers(ranges);                                    // "0-2,3-5"
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/models/model.h"
#include "pptrain/partition/partition.h"  // LayerRange, format_stage_layers

namespace pptrain {

struct StageLayerOptions {
  ModelOptions model;
  std::string partition = "uniform";  // uniform | params | time | FILE.json
  std::string stage_layers;           // resolved ranges "0-2,3-5" (a launcher's); wins over
                                      // `partition`
  int64_t microbatch_size = 1;        // samples per microbatch: what `time` profiles with
  int ranks = 1;                      // P, only for messages ("4 (--pp 2 x 2 chunks)")
  bool may_profile = true;  // false: `time` (which would measure this process) is a UserError
};

// The ranges of the run's `num_stages` stages (P x V), stage order. With one stage nothing is
// profiled. UserError, one line, for every bad input: unknown method, unreadable or malformed
// file, a file for another model or another number of stages, replicas > 1, a stage without
// layers.
std::vector<LayerRange> plan_stage_layers(const StageLayerOptions& options, int num_stages);

// `--partition workers`: the partition the ranks decide among themselves once they have met.
constexpr const char* kWorkersPartition = "workers";

// Every layer of the model timed on this machine (models/profiler.h) with the options'
// microbatch size: what `time` cuts by.
Profile profile_layers(const StageLayerOptions& options);

// The `time` cut of `profile` (profile_layers()) when stage s runs on a worker of relative speed
// stage_speeds[s] (partition/workers.h), checked as plan_stage_layers() checks a cut.
std::vector<LayerRange> stage_layers_for_speeds(const StageLayerOptions& options,
                                                const Profile& profile,
                                                const std::vector<double>& stage_speeds);

// The replicas of each stage when `partition` is a partition file (`pptrain partition --method
// pipedream`) that replicates some stage, e.g. {3, 1}: the run is then PipeDream's round robin
// over sum(replicas) workers (generators/generators.h, make_1f1b_rr). Empty otherwise.
std::vector<int> partition_replicas(const std::string& partition);

// Per-stage times of one microbatch, in ms, from the profile `partition` names when it is a
// profile JSON file (`pptrain profile`): each stage's layers summed. Nothing for uniform, params,
// time and partition files, which carry no times (a measured `time` differs between processes).
struct StageTimesMs {
  std::vector<double> forward, backward_input, backward_weight;  // [num_stages]
};
std::optional<StageTimesMs> profiled_stage_times(const std::string& partition,
                                                 const std::vector<LayerRange>& ranges);

// One line for the run's log: "partition params: stage 0 = layers 0-2 (embedding..block1), ...".
std::string describe_stage_layers(const ModelOptions& model, const std::string& partition,
                                  const std::vector<LayerRange>& ranges);

}  // namespace pptrain
