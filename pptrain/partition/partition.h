// Cutting a profiled model into pipeline stages. Throughput is set by the slowest stage, so the
// cut matters as much as the schedule.
//
// Methods (docs/PARTITIONING.md gives the exact cost models):
//   uniform   - equal layer counts (the first stages take one more layer when P does not divide L)
//   params    - minimises the largest stage's parameter bytes (DeepSpeed's "parameters")
//   time      - minimises the slowest stage's forward+backward time, optimally; with a bandwidth,
//               a cut's activation and gradient transfer also bounds the stage (overlapped);
//               with worker speeds, each stage's time on the worker that holds it
//   pipedream - PipeDream's dynamic programme over layer ranges and replica counts, per level of
//               a hierarchical machine, with data-parallel sync time and an optional memory limit
//
//   Profile profile = read_profile("data/pipedream/vgg16/graph.txt");
//   PartitionOptions options;
//   options.method = "pipedream";
//   options.levels = {{4, 1e9}};          // 4 workers, 1 GB/s between them
//   Partition p = make_partition(profile, options);
//   std::string text = to_json(p);        // the trainer reads it back with parse_partition_json()
//
// Layer indices refer to profile.layers. Nothing here knows about the CLI.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "pptrain/partition/profile.h"

namespace pptrain {

// Layers [first, last] of one stage, inclusive.
using LayerRange = std::pair<int, int>;

// "0-2,3-5" and back (`--stage-layers`). parse_stage_layers checks only the syntax (UserError
// naming the bad range); a user of the ranges checks them against its model.
std::string format_stage_layers(const std::vector<LayerRange>& ranges);
std::vector<LayerRange> parse_stage_layers(const std::string& text);

struct StagePlan {
  int first_layer = 0;   // inclusive
  int last_layer = 0;    // inclusive
  int replicas = 1;      // data-parallel copies of the stage (pipedream only; 1 otherwise)
  double compute_s = 0;  // forward+backward time of one microbatch, divided by replicas
};

struct Partition {
  std::string method;
  std::vector<StagePlan> stages;
  double time_per_minibatch_s = 0;  // the bottleneck: the pipeline's steady-state time per input
  double speedup_vs_single = 1;     // one worker's compute time / time_per_minibatch_s
};

// One level of a hierarchical machine, innermost first: {4, 100e9} then {4, 10e9} is four
// servers of four GPUs each, 100 GB/s inside a server and 10 GB/s between servers.
struct Level {
  int workers = 1;
  double bandwidth_bytes_per_s = 0;
};

// PipeDream's optimizer uses this bandwidth when none is given (1 GB/s, about 10 Gbit Ethernet).
constexpr double kDefaultBandwidthBytesPerS = 1e9;
// The largest problems the partitioners take (checked up front, one-line error). PipeDream's
// dynamic program grows about as (layers x workers)^2: resnet50's 177 layers on 256 workers take
// 1.8 s here, on 1024 workers 28 s; 10,000 layers on 8 workers 5 s. kMaxPipeDreamLayerWorkers
// keeps it under about 20 s.
constexpr int kMaxPartitionWorkers = 1024;
constexpr int kMaxProfileLayers = 10000;
constexpr long long kMaxPipeDreamLayerWorkers = 150000;

struct PartitionOptions {
  std::string method = "time";  // uniform | params | time | pipedream
  int stages = 0;               // P, for uniform/params/time (exactly P non-empty stages)
  // uniform/params/time: the link bandwidth between stages; 0 = count compute only.
  double bandwidth_bytes_per_s = 0;
  std::vector<Level> levels;  // pipedream: the machine, innermost level first
  double memory_limit_bytes =
      0;  // pipedream: per worker, as PipeDream counts it (>= 1 copy); 0 = none
  // time: the relative speed of the worker holding each stage (workers.h), [stages]; a stage's
  // compute takes 1/speed as long there. Empty: every worker equal (the same cut as all 1s).
  std::vector<double> stage_speeds;
};

// The flags of `pptrain partition` (its messages name them), for the CLI and the Python package.
struct PartitionRequest {
  std::string method;           // uniform | params | time | pipedream
  int pp = 0;                   // stages, for uniform/params/time
  int workers = 0;              // pipedream: one level of that many at kDefaultBandwidthBytesPerS
  std::vector<Level> levels;    // pipedream: the machine, innermost first (instead of workers)
  double bandwidth = 0;         // uniform/params/time: bytes/s between stages; 0: compute only
  double memory_limit = 0;      // pipedream: bytes per worker; 0: none
  std::string workers_profile;  // time: a workers profile (workers.h), stage p on rank p
};

// The options of a request, refusing combinations that mean nothing for its method (UserError
// naming the flags).
PartitionOptions partition_options(const PartitionRequest& request);

// "uniform", "params", "time", "pipedream".
const std::vector<std::string>& partition_methods();
// Throws UserError unless `method` is one of partition_methods().
void check_partition_method(const std::string& method);

// Throws UserError for impossible options (more stages than layers, no levels for pipedream, ...).
Partition make_partition(const Profile& profile, const PartitionOptions& options);

// The time of one stage (layers first..last, no replicas) under the `time` cost model:
// compute, or with a bandwidth the larger of compute and the transfers at its two cuts.
double stage_time_s(const Profile& profile, int first_layer, int last_layer,
                    double bandwidth_bytes_per_s);

// JSON: {"method", "stages": [{"first_layer", "last_layer", "replicas", "compute_s"}],
//        "time_per_minibatch_s", "speedup_vs_single"}.
std::string to_json(const Partition& partition);
// Throws UserError for malformed text or stages that are not contiguous from layer 0.
Partition parse_partition_json(const std::string& text);
// Throws UserError unless the stages cover layers 0..num_layers-1 exactly, in order.
void check_partition(const Partition& partition, int num_layers);

}  // namespace pptrain
