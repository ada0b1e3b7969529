#include "pptrain/planner/plan_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/partition/workers.h"
#include "pptrain/render/svg.h"

namespace pptrain {
namespace {

constexpr const char* kPlanFormat = "pptrain-plan-1";

nlohmann::ordered_json candidate_json(const Candidate& c) {
  nlohmann::ordered_json out;
  out["partition"] = c.partition;
  out["schedule"] = c.schedule;
  out["chunks"] = c.chunks;
  out["microbatches"] = c.microbatches;
  out["microbatch_size"] = c.microbatch_size;
  out["recompute"] = c.recompute;
  out["stage_layers"] = format_stage_layers(c.stage_layers);
  out["step_ms"] = c.step_ms;
  out["bubble_ratio"] = c.bubble_ratio;
  out["max_peak_bytes"] = c.max_peak_bytes();
  out["peak_bytes"] = c.peak_bytes;
  if (!c.placement.empty()) out["placement"] = format_placement(c.placement);
  if (!c.dp_shares.empty()) out["dp_shares"] = format_dp_shares(c.dp_shares);
  return out;
}

const nlohmann::json& field(const nlohmann::json& object, const char* key,
                            const std::string& where) {
  PPTRAIN_CHECK(object.is_object() && object.contains(key), where, ": missing field '", key, "'");
  return object[key];
}

int whole_number(const nlohmann::json& object, const char* key, const std::string& where) {
  const nlohmann::json& value = field(object, key, where);
  PPTRAIN_CHECK(value.is_number_integer() && value.get<long long>() >= 1 &&
                    value.get<long long>() <= (1 << 30),
                where, ": '", key, "' must be a whole number >= 1, got ", value.dump());
  return value.get<int>();
}

std::string text(const nlohmann::json& object, const char* key, const std::string& where) {
  const nlohmann::json& value = field(object, key, where);
  PPTRAIN_CHECK(value.is_string() && !value.get<std::string>().empty(), where, ": '", key,
                "' must be a non-empty string, got ", value.dump());
  return value.get<std::string>();
}

}  // namespace

std::string plan_json(const Profile& profile, const PlannerOptions& options,
                      const PlanSearch& search, const PlanFiles& files) {
  PPTRAIN_ASSERT(!search.ranked.empty(), "a plan without a candidate");
  nlohmann::ordered_json out;
  out["format"] = kPlanFormat;
  out["profile"] = profile.source;
  out["layers"] = profile.layers.size();
  out["workers"] = options.workers;
  if (options.copies > 1) out["dp"] = options.copies;
  out["memory_limit_bytes"] = options.memory_limit_bytes;
  out["memory_margin"] = options.memory_margin;
  out["batch_size"] = search.batch_size * options.copies;  // over the copies
  // What the activation bytes were taken at (`plan --precision`): the run must compute in it.
  out["precision"] = precision_name(profile.precision);
  out["profile_microbatch_size"] = search.profile_microbatch_size;
  out["optimizer_state_factor"] = options.optimizer_state_factor;
  out["mem_w_ratio"] = options.mem_w_ratio;
  // The share of each layer's backward assumed to be W; null: the profile gives I and W itself.
  out["w_fraction"] = profile.splits_backward() ? nlohmann::ordered_json()
                                                : nlohmann::ordered_json(options.w_fraction);
  out["evaluated"] = search.evaluated;
  out["fitting"] = search.fitting;
  out["winner"] = candidate_json(search.ranked.front());
  out["files"] = {{"partition", files.partition}, {"schedule", files.schedule}, {"svg", files.svg}};
  out["ranked"] = nlohmann::ordered_json::array();
  for (const Candidate& c : search.ranked) out["ranked"].push_back(candidate_json(c));
  return out.dump(2) + "\n";
}

std::string write_plan_folder(const std::string& folder, const Profile& profile,
                              const PlannerOptions& options, const PlanSearch& search,
                              const PlanFiles& files) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  PPTRAIN_CHECK(!error && std::filesystem::is_directory(folder), "--out: cannot make folder '",
                folder, "'", error ? ": " + error.message() : std::string());
  Candidate winner = search.ranked.front();
  Evaluation evaluation = evaluate(profile, options, winner);
  const std::filesystem::path out(folder);
  Timeline& timeline = evaluation.sim.timeline;
  char title[160];
  std::snprintf(title, sizeof title, "plan: %s, P=%d, V=%d, M=%d%s, %s partition, %.3f ms",
                winner.schedule.c_str(), options.workers, winner.chunks, winner.microbatches,
                winner.recompute ? ", recompute" : "", winner.partition.c_str(), winner.step_ms);
  timeline.title = title;
  // The drawing, the longest to make, on a thread of its own while this one writes the rest
  // (a failure of either is thrown here, this thread's first: the future waits when destroyed).
  std::future<void> svg = std::async(std::launch::async, [&] {
    write_text_file((out / files.svg).string(), render_svg(timeline), "SVG file");
  });
  write_text_file((out / files.partition).string(), to_json(winner_partition(profile, winner)),
                  "partition file");
  write_text_file((out / files.schedule).string(), to_csv(evaluation.schedule), "schedule file");
  const std::string json = plan_json(profile, options, search, files);
  write_text_file((out / "plan.json").string(), json, "plan file");
  svg.get();
  return json;
}

PlanFile read_plan_file(const std::string& path) {
  return parse_plan_json(read_text_file(path, "plan file"), path);
}

PlanFile parse_plan_json(const std::string& body, const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(detail::concat(path, ": not valid JSON: ", e.what()));
  }
  PPTRAIN_CHECK(doc.is_object() && doc.value("format", "") == kPlanFormat, path,
                ": not a plan (expected \"format\": \"", kPlanFormat, "\", from pptrain plan)");
  PlanFile plan;
  plan.path = path;
  plan.workers = whole_number(doc, "workers", path);
  if (doc.contains("dp")) plan.dp = whole_number(doc, "dp", path);
  plan.batch_size = whole_number(doc, "batch_size", path);
  if (doc.contains("precision")) {
    plan.precision = parse_precision(text(doc, "precision", path), path + ": precision");
  }
  const std::string where = path + ": winner";
  const nlohmann::json& winner = field(doc, "winner", path);
  plan.schedule = text(winner, "schedule", where);
  plan.chunks = whole_number(winner, "chunks", where);
  plan.microbatches = whole_number(winner, "microbatches", where);
  const nlohmann::json& recompute = field(winner, "recompute", where);
  PPTRAIN_CHECK(recompute.is_boolean(), where, ": 'recompute' must be true or false, got ",
                recompute.dump());
  plan.recompute = recompute.get<bool>();
  plan.stage_layers = parse_stage_layers(text(winner, "stage_layers", where));
  PPTRAIN_CHECK(
      static_cast<long long>(plan.stage_layers.size()) == 1LL * plan.workers * plan.chunks, where,
      ": ", plan.stage_layers.size(), " stage layer ranges for ", plan.workers, " workers x ",
      plan.chunks, " chunks");
  if (winner.contains("placement")) {
    plan.placement =
        parse_placement(text(winner, "placement", where), plan.workers, where + ": placement");
  }
  PPTRAIN_CHECK(plan.batch_size % plan.microbatches == 0, path, ": batch_size ", plan.batch_size,
                " is not a multiple of the winner's ", plan.microbatches, " microbatches");
  if (winner.contains("dp_shares")) {
    const std::string what = where + ": dp_shares";
    plan.dp_shares = parse_dp_shares(text(winner, "dp_shares", where), what);
    check_dp_shares(plan.dp_shares, plan.dp, plan.microbatches, what);
    int sum = 0;
    for (int share : plan.dp_shares) sum += share;
    PPTRAIN_CHECK(sum == plan.batch_size, what, " sum to ", sum, ", not the batch_size ",
                  plan.batch_size);
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  const nlohmann::json& files = field(doc, "files", path);
  plan.partition_file = (folder / text(files, "partition", path + ": files")).string();
  plan.schedule_file = (folder / text(files, "schedule", path + ": files")).string();
  plan.svg_file = (folder / text(files, "svg", path + ": files")).string();
  return plan;
}

Partition winner_partition(const Profile& profile, const Candidate& winner) {
  Partition out;
  out.method = "plan: " + winner.partition;
  double total_s = 0;
  for (const auto& [first, last] : winner.stage_layers) {
    StagePlan stage;
    stage.first_layer = first;
    stage.last_layer = last;
    for (int l = first; l <= last; ++l) stage.compute_s += profile.layers[l].compute_ms() / 1000;
    total_s += stage.compute_s;
    out.time_per_minibatch_s = std::max(out.time_per_minibatch_s, stage.compute_s);
    out.stages.push_back(stage);
  }
  out.speedup_vs_single = out.time_per_minibatch_s > 0 ? total_s / out.time_per_minibatch_s : 1;
  return out;
}

}  // namespace pptrain
