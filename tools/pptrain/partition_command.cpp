// `pptrain partition`: cut a profiled model into pipeline stages and print the plan (a table, or
// one JSON object with --json that `pptrain train --partition FILE.json` reads back).
//
//   pptrain partition --profile gpt.json --method time --pp 4
//   pptrain partition --profile data/pipedream/vgg16/graph.txt --method pipedream --workers 4
//   pptrain partition --profile data/pipedream/resnet50/graph.txt --method pipedream
//                     --levels 4:100e9,4:1e9 --json
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

struct PartitionArgs {
  std::string profile_path;
  std::string method;
  int pp = 0;
  int workers = 0;
  std::string levels;
  double bandwidth = 0;
  double memory_limit = 0;
  std::string workers_profile;
  bool json = false;
};

// "4:100e9,4:1e9" -> {{4, 100e9}, {4, 1e9}}, innermost level first.
std::vector<Level> parse_levels(const std::string& text) {
  const char* expected =
      "expected N:BYTES_PER_S[,N:BYTES_PER_S...] (innermost level first), e.g. 4:100e9,4:1e9";
  std::vector<Level> levels;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    size_t colon = item.find(':');
    PPTRAIN_CHECK(colon != std::string::npos, "--levels: bad level '", item, "'; ", expected);
    std::string workers = item.substr(0, colon), bandwidth = item.substr(colon + 1);
    char* end = nullptr;
    long n = std::strtol(workers.c_str(), &end, 10);
    PPTRAIN_CHECK(!workers.empty() && *end == '\0' && n >= 1 && n <= 1 << 20,
                  "--levels: bad worker count '", workers, "' in '", item,
                  "'; expected an integer >= 1");
    double bw = std::strtod(bandwidth.c_str(), &end);
    PPTRAIN_CHECK(!bandwidth.empty() && *end == '\0' && bw > 0, "--levels: bad bandwidth '",
                  bandwidth, "' in '", item, "'; expected bytes per second > 0");
    levels.push_back({static_cast<int>(n), bw});
  }
  PPTRAIN_CHECK(!levels.empty(), "--levels: empty; ", expected);
  return levels;
}

PartitionOptions options_from(const PartitionArgs& args) {
  PartitionRequest request;
  request.method = args.method;
  request.pp = args.pp;
  request.workers = args.workers;
  if (!args.levels.empty()) request.levels = parse_levels(args.levels);
  request.bandwidth = args.bandwidth;
  request.memory_limit = args.memory_limit;
  request.workers_profile = args.workers_profile;
  return partition_options(request);
}

std::string shortened(const std::string& name, size_t width) {
  return name.size() <= width ? name : name.substr(0, width - 3) + "...";
}

void print_table(const Profile& profile, const PartitionOptions& options, const Partition& part) {
  std::printf("%s partition of %s (%zu layers)", part.method.c_str(), profile.source.c_str(),
              profile.layers.size());
  if (part.method == "pipedream") {
    std::printf(", levels (innermost first):");
    for (const Level& l : options.levels)
      std::printf(" %d @ %.3g B/s", l.workers, l.bandwidth_bytes_per_s);
  } else if (options.bandwidth_bytes_per_s > 0) {
    std::printf(", links %.3g B/s", options.bandwidth_bytes_per_s);
  }
  if (!options.stage_speeds.empty()) {
    std::printf(", worker speeds");
    for (double speed : options.stage_speeds) std::printf(" %.3g", speed);
  }
  std::printf("\n%5s  %-9s  %8s  %11s  %s\n", "stage", "layers", "replicas", "compute_s",
              "first layer .. last layer");
  for (size_t s = 0; s < part.stages.size(); ++s) {
    const StagePlan& st = part.stages[s];
    std::string range = std::to_string(st.first_layer) + "-" + std::to_string(st.last_layer);
    std::printf("%5zu  %-9s  %8d  %11.6f  %s .. %s\n", s, range.c_str(), st.replicas, st.compute_s,
                shortened(profile.layers[st.first_layer].name, 32).c_str(),
                shortened(profile.layers[st.last_layer].name, 32).c_str());
  }
  std::printf("time per minibatch: %.6f s   speed-up vs one worker: %.3fx\n",
              part.time_per_minibatch_s, part.speedup_vs_single);
}

}  // namespace

void add_partition_command(CLI::App& app) {
  auto args = std::make_shared<PartitionArgs>();
  CLI::App* command = app.add_subcommand(
      "partition", "Cut a profiled model into pipeline stages (docs/PARTITIONING.md)");
  add_profile_option(command, args->profile_path);
  command->add_option("--method", args->method, "uniform, params, time or pipedream")->required();
  command->add_option("--pp", args->pp, "Stages, for uniform/params/time");
  command->add_option("--workers", args->workers,
                      "Workers, for pipedream (one level at 1e9 B/s unless --levels)");
  command->add_option("--levels", args->levels,
                      "pipedream machine, innermost level first: N1:BYTES_PER_S,N2:BYTES_PER_S");
  command->add_option("--bandwidth", args->bandwidth,
                      "uniform/params/time: bytes/s between stages (0: compute only)");
  command->add_option("--memory-limit", args->memory_limit,
                      "pipedream: bytes per worker (0: none)");
  command->add_option("--workers-profile", args->workers_profile,
                      "time: the workers' speeds (pptrain-workers-1 JSON); stage p on rank p, "
                      "its compute divided by the rank's speed");
  command->add_flag("--json", args->json, "Print one JSON object instead of a table");

  command->callback([args] {
    PartitionOptions options = options_from(*args);
    Profile profile = read_profile(args->profile_path);
    Partition part = make_partition(profile, options);
    if (args->json) {
      std::printf("%s\n", to_json(part).c_str());
    } else {
      print_table(profile, options, part);
    }
  });
}

}  // namespace pptrain::cli
