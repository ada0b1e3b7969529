#include "pptrain/train/partition_plan.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/models/profiler.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {
namespace {

// "gpt --layers 4 (6 layers: embedding, 4 blocks, head)", for messages.
std::string model_text(const ModelOptions& model) {
  const int L = num_layers(model);
  std::string text = model.kind + " --layers " + std::to_string(model.layers) + " (" +
                     std::to_string(L) + " layers";
  if (L != num_blocks(model)) {
    text += ": embedding, " + std::to_string(num_blocks(model)) + " blocks, head";
  }
  return text + ")";
}

// "4 (--pp 2 x 2 chunks)".
std::string stages_text(const StageLayerOptions& options, int num_stages) {
  return std::to_string(num_stages) + " (--pp " + std::to_string(options.ranks) + " x " +
         std::to_string(num_stages / options.ranks) + " chunk" +
         (num_stages / options.ranks == 1 ? "" : "s") + ")";
}

// Checks a partition against the run: it covers exactly the model's layers, every stage has at
// least one, and it has the run's number of stages (replicas: partition_replicas()). Coverage is
// checked first: a file for another model size is the more likely mistake, and the message says so.
std::vector<LayerRange> checked_ranges(const Partition& partition, const std::string& what,
                                       const StageLayerOptions& options, int num_stages) {
  const int L = num_layers(options.model);
  std::vector<LayerRange> ranges;
  int next = 0;
  for (size_t s = 0; s < partition.stages.size(); ++s) {
    const StagePlan& stage = partition.stages[s];
    PPTRAIN_CHECK(stage.first_layer == next && stage.first_layer <= stage.last_layer, what,
                  ": stage ", s, " has layers ", stage.first_layer, "-", stage.last_layer,
                  ", expected a non-empty range starting at layer ", next,
                  " (every stage needs at least one layer)");
    PPTRAIN_CHECK(stage.last_layer < L, what, ": stage ", s, " ends at layer ", stage.last_layer,
                  ", but the model has layers 0-", L - 1, " only: ", model_text(options.model));
    ranges.emplace_back(stage.first_layer, stage.last_layer);
    next = stage.last_layer + 1;
  }
  PPTRAIN_CHECK(next == L, what, " covers layers 0-", next - 1, ", but the model has layers 0-",
                L - 1, ": ", model_text(options.model));
  PPTRAIN_CHECK(static_cast<int>(ranges.size()) == num_stages, what, " has ", ranges.size(),
                " stages, but the run has ", stages_text(options, num_stages));
  return ranges;
}

// A profile read from a file must describe this model: same length, same layer names.
void check_profile_matches(const Profile& profile, const std::string& what,
                           const ModelOptions& model) {
  const int L = num_layers(model);
  PPTRAIN_CHECK(static_cast<int>(profile.layers.size()) == L, what, " is a profile of ",
                profile.layers.size(), " layers, but the model has ", L, ": ", model_text(model));
  for (int i = 0; i < L; ++i) {
    PPTRAIN_CHECK(profile.layers[i].name == layer_name(model, i), what, ": layer ", i, " is '",
                  profile.layers[i].name, "' in the profile but '", layer_name(model, i),
                  "' in the model (", model_text(model), ")");
  }
}

// Parameter bytes of every layer, from the layers themselves: all `params` needs, and the same
// on every process.
Profile parameter_profile(const ModelOptions& model) {
  Profile profile;
  profile.source = "the model's parameters";
  for (int i = 0; i < num_layers(model); ++i) {
    LayerProfile layer;
    layer.name = layer_name(model, i);
    for (const auto& p : make_layer(model, i).ptr()->parameters()) {
      layer.parameter_bytes += static_cast<double>(p.numel() * p.element_size());
    }
    profile.layers.push_back(layer);
  }
  return profile;
}

std::vector<LayerRange> partitioned(const Profile& profile, const std::string& method,
                                    const std::string& what, const StageLayerOptions& options,
                                    int num_stages, const std::vector<double>& stage_speeds = {}) {
  PartitionOptions partition_options;
  partition_options.method = method;
  partition_options.stages = num_stages;
  partition_options.stage_speeds = stage_speeds;
  return checked_ranges(make_partition(profile, partition_options), what, options, num_stages);
}

// FILE.json: a partition ("stages") or a profile ("layers"), by content.
std::vector<LayerRange> from_file(const std::string& path, const StageLayerOptions& options,
                                  int num_stages) {
  const std::string what = "--partition '" + path + "'";
  const std::string text = read_text_file(path, "--partition file");
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  PPTRAIN_CHECK(doc.is_object() && (doc.contains("stages") || doc.contains("layers")), what,
                " is neither a partition JSON (`pptrain partition --json`, with 'stages') nor a "
                "profile JSON (`pptrain profile`, with 'layers')");
  if (doc.contains("stages")) {
    Partition partition;
    try {
      partition = parse_partition_json(text);
    } catch (const UserError& e) {
      throw UserError(what + ": " + e.what());
    }
    return checked_ranges(partition, what, options, num_stages);
  }
  const Profile profile = parse_profile_json(text, what);
  check_profile_matches(profile, what, options.model);
  return partitioned(profile, "time", what + " (partitioned with time)", options, num_stages);
}

}  // namespace

Profile profile_layers(const StageLayerOptions& options) {
  ProfileOptions profile_options;
  profile_options.model = options.model;
  profile_options.microbatch_size = options.microbatch_size;
  const ModelProfile measured = profile_model(profile_options);
  Profile profile;
  profile.layers = measured.layers;
  profile.microbatch_size = static_cast<int>(options.microbatch_size);
  profile.input_bytes = measured.input_bytes;
  profile.target_bytes = measured.target_bytes;
  profile.source = "a profile of this machine";
  return profile;
}

std::vector<LayerRange> stage_layers_for_speeds(const StageLayerOptions& options,
                                                const Profile& profile,
                                                const std::vector<double>& stage_speeds) {
  const int num_stages = static_cast<int>(stage_speeds.size());
  return partitioned(profile, "time", "--partition workers", options, num_stages, stage_speeds);
}

std::vector<int> partition_replicas(const std::string& partition) {
  if (!std::filesystem::is_regular_file(partition)) return {};
  const std::string text = read_text_file(partition, "--partition file");
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("stages")) return {};
  Partition parsed;
  try {
    parsed = parse_partition_json(text);
  } catch (const UserError& e) {
    throw UserError("--partition '" + partition + "': " + e.what());
  }
  std::vector<int> replicas;
  for (const StagePlan& stage : parsed.stages) replicas.push_back(stage.replicas);
  const bool replicated =
      std::any_of(replicas.begin(), replicas.end(), [](int r) { return r > 1; });
  return replicated ? replicas : std::vector<int>{};
}

std::vector<LayerRange> plan_stage_layers(const StageLayerOptions& options, int num_stages) {
  PPTRAIN_CHECK(num_stages >= 1, "a run needs at least one stage, got ", num_stages);
  if (!options.stage_layers.empty()) {
    Partition given;
    for (const auto& [first, last] : parse_stage_layers(options.stage_layers)) {
      given.stages.push_back({first, last, 1, 0});
    }
    return checked_ranges(given, "--stage-layers '" + options.stage_layers + "'", options,
                          num_stages);
  }
  const std::string& spec = options.partition;
  // workers: uniform until the ranks have measured themselves (job/worker_speeds.h).
  if (spec == "uniform" || spec == kWorkersPartition) {
    return uniform_split(options.model, num_stages);
  }
  if (spec == "params" || spec == "time") {
    // One stage holds everything: nothing to balance, nothing to measure.
    if (num_stages == 1) return {{0, num_layers(options.model) - 1}};
    PPTRAIN_CHECK(spec == "params" || options.may_profile,
                  "--partition time would time the layers in every rank, and the ranks would "
                  "disagree; with RANK set (torchrun) give a profile instead: pptrain profile "
                  "--out P.json ..., then --partition P.json");
    const Profile profile =
        spec == "params" ? parameter_profile(options.model) : profile_layers(options);
    return partitioned(profile, spec, "--partition " + spec, options, num_stages);
  }
  PPTRAIN_CHECK(std::filesystem::is_regular_file(spec), "--partition '", spec,
                "': expected uniform, params, time, workers, or an existing partition or profile "
                "JSON file");
  return from_file(spec, options, num_stages);
}

std::optional<StageTimesMs> profiled_stage_times(const std::string& partition,
                                                 const std::vector<LayerRange>& ranges) {
  if (!std::filesystem::is_regular_file(partition)) return std::nullopt;
  const std::string text = read_text_file(partition, "--partition file");
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("layers")) return std::nullopt;
  const Profile profile = parse_profile_json(text, "--partition '" + partition + "'");
  const CostModel cost = cost_from_profile(profile, ranges, /*replicas=*/1);
  StageTimesMs out;
  out.forward = cost.stage_forward;
  out.backward_input = cost.stage_backward_input;
  out.backward_weight = cost.stage_backward_weight;
  return out;
}

std::string describe_stage_layers(const ModelOptions& model, const std::string& partition,
                                  const std::vector<LayerRange>& ranges) {
  std::string text = "partition " + partition + ":";
  for (size_t s = 0; s < ranges.size(); ++s) {
    const auto& [first, last] = ranges[s];
    text += (s == 0 ? " stage " : ", stage ") + std::to_string(s) + " = ";
    if (first == last) {
      text += "layer " + std::to_string(first) + " (" + layer_name(model, first) + ")";
    } else {
      text += "layers " + std::to_string(first) + "-" + std::to_string(last) + " (" +
              layer_name(model, first) + ".." + layer_name(model, last) + ")";
    }
  }
  return text;
}

}  // namespace pptrain
