#include "pptrain/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/generators.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {
namespace {

constexpr const char* kAutoSchedule = "zb-auto";
constexpr double kLimitSlack = 1e-9;  // share of the limit a peak may pass it by (rounding)

// The options with every default filled in from the profile.
struct Resolved {
  int batch = 0;         // samples per step
  int profile_size = 0;  // samples the profile's figures are for
  std::vector<int> microbatches;
  std::vector<std::string> partitions;
  std::vector<std::string> schedules;
};

Resolved resolve(const Profile& profile, const PlannerOptions& options) {
  check_planner_options(options);
  Resolved out;
  out.profile_size = options.profile_microbatch_size > 0 ? options.profile_microbatch_size
                     : profile.microbatch_size > 0       ? profile.microbatch_size
                                                         : 1;
  out.batch = options.batch_size > 0 ? options.batch_size : 4 * options.workers * out.profile_size;
  out.microbatches = options.microbatches;
  if (out.microbatches.empty()) {
    for (int m = options.min_microbatches; m <= std::min(out.batch, options.max_microbatches);
         ++m) {
      if (out.batch % m == 0) out.microbatches.push_back(m);
    }
  }
  PPTRAIN_CHECK(!out.microbatches.empty(), "no microbatch count in ", options.min_microbatches, "-",
                options.max_microbatches, " divides the batch of ", out.batch, " samples");
  for (int m : out.microbatches) {
    PPTRAIN_CHECK(out.batch % m == 0, "microbatches ", m, " does not divide the batch of ",
                  out.batch, " samples (each microbatch needs a whole number of samples)");
  }
  out.partitions = options.partitions.empty() ? partition_methods() : options.partitions;
  out.schedules = options.schedules.empty() ? synchronous_schedules() : options.schedules;
  return out;
}

// The profile for microbatches `scale` times the profiled one: times and activations scale,
// parameters do not. A profile with one backward time per layer gives w_fraction of it to W.
Profile scaled_profile(const Profile& profile, double scale, const PlannerOptions& options) {
  Profile out = profile;
  const bool split = !profile.splits_backward();
  for (LayerProfile& layer : out.layers) {
    if (split) {
      layer.backward_weight_ms = options.w_fraction * layer.backward_input_ms;
      layer.backward_input_ms -= layer.backward_weight_ms;
    }
    layer.forward_ms *= scale;
    layer.backward_input_ms *= scale;
    layer.backward_weight_ms *= scale;
    layer.activation_bytes *= scale;
    layer.stash_bytes *= scale;
    if (layer.weight_stash_bytes >= 0) layer.weight_stash_bytes *= scale;
  }
  return out;
}

double sum_layers(const Profile& profile, const LayerRange& range, double LayerProfile::*field) {
  double sum = 0;
  for (int l = range.first; l <= range.second; ++l) sum += profile.layers[l].*field;
  return sum;
}

// What W keeps of the stage's activations after I: the profile's measured weight stash of its
// layers, or mem_w_ratio of a layer's stash where the profile has none.
double weight_stash(const Profile& profile, const LayerRange& range, double mem_w_ratio) {
  double sum = 0;
  for (int l = range.first; l <= range.second; ++l) {
    const LayerProfile& layer = profile.layers[l];
    sum +=
        layer.weight_stash_bytes >= 0 ? layer.weight_stash_bytes : mem_w_ratio * layer.stash_bytes;
  }
  return sum;
}

// The candidate's cost model in ms and bytes (see the header). `split`: whether the schedule
// runs I and W apart, which decides what recomputation keeps.
CostModel candidate_cost(const Profile& profile, const Candidate& c, double mem_w_ratio,
                         bool split) {
  CostModel cost = cost_from_profile(profile, c.stage_layers, 1);
  // A replicated stage's all-reduce needs a bandwidth; without a measurement, PipeDream's 1 GB/s.
  if (cost.reduce_bandwidth <= 0) cost.reduce_bandwidth = kDefaultBandwidthBytesPerS / 1000;
  cost.mem_w_ratio = mem_w_ratio;
  for (size_t s = 0; s < c.stage_layers.size(); ++s) {
    const LayerRange& range = c.stage_layers[s];
    const double stash = sum_layers(profile, range, &LayerProfile::stash_bytes);
    const double kept_for_w = weight_stash(profile, range, mem_w_ratio);
    // The stage's input: a message from the stage before (a copy of what it keeps) when that
    // one is on another rank; counted for every stage after the first (an upper bound for the
    // V shapes' stages that take their input on the same rank).
    const double input = range.first > 0 ? profile.layers[range.first - 1].activation_bytes : 0;
    if (!c.recompute) {
      cost.stage_activation.push_back(input + stash);
      cost.stage_weight_stash.push_back(kept_for_w);
      continue;
    }
    cost.stage_activation.push_back(split ? input + kept_for_w : input);
    cost.stage_weight_stash.push_back(split ? kept_for_w : mem_w_ratio * input);
    cost.stage_backward_input[s] += cost.stage_forward[s];  // the forward runs again
  }
  return cost;
}

// A hand-written schedule of the candidate's name, V and M (zb-auto: evaluate_auto).
Schedule generate(const Candidate& c, int ranks) {
  ScheduleOptions request;
  request.name = c.schedule;
  request.ranks = ranks;
  request.microbatches = c.microbatches;
  request.chunks = c.chunks;
  check_schedule_size(ranks, c.chunks, c.microbatches);
  return make_schedule(request);
}

// The bytes of each rank that do not depend on the schedule's order: weights, gradients and
// optimizer state of its stages, and with recomputation the rerun forward of its largest stage.
std::vector<double> fixed_bytes(const Profile& profile, const PlannerOptions& options,
                                const Candidate& c, const Schedule& schedule) {
  std::vector<double> out(schedule.num_ranks, 0);
  for (int r = 0; r < schedule.num_ranks; ++r) {
    double rerun = 0;
    for (int s : schedule.stages_of(r)) {
      const LayerRange& range = c.stage_layers[s];
      out[r] += (2 + options.optimizer_state_factor) *
                sum_layers(profile, range, &LayerProfile::parameter_bytes);
      if (c.recompute)
        rerun = std::max(rerun, sum_layers(profile, range, &LayerProfile::stash_bytes));
    }
    out[r] += rerun;
  }
  return out;
}

bool better(const Candidate& a, const Candidate& b) {
  if (a.step_ms != b.step_ms) return a.step_ms < b.step_ms;
  return a.max_peak_bytes() < b.max_peak_bytes();
}

// The activation budget of each rank zb-auto plans under: the limit less that rank's own fixed
// bytes (its stages are one per rank, stage r on rank r), in bytes; empty without a limit, or
// when some rank has not room for one microbatch of its stage (no schedule fits there: planned
// without a limit, the result is dropped as too large).
std::vector<double> auto_schedule_limits(const Profile& profile, const PlannerOptions& options,
                                         const Candidate& c, const StageCosts& costs) {
  if (options.memory_limit_bytes <= 0) return {};
  const int ranks = costs.stages();
  Schedule shape;
  shape.num_ranks = ranks;
  shape.num_stages = ranks;
  for (int r = 0; r < ranks; ++r) shape.stage_to_rank.push_back(r);
  std::vector<double> budgets = fixed_bytes(profile, options, c, shape);
  for (int r = 0; r < ranks; ++r) {
    budgets[r] = options.memory_limit_bytes - budgets[r];
    if (budgets[r] < costs.activation[r]) return {};
  }
  return budgets;
}

// A validated schedule's simulation and peak bytes under the candidate's cost model; fills the
// candidate's predicted figures.
Evaluation measure(const Profile& scaled, const PlannerOptions& options, Candidate& c,
                   const ValidatedSchedule& validated, Schedule schedule) {
  // Recomputation keeps less between F and B when the backward is not split.
  const CostModel cost = candidate_cost(scaled, c, options.mem_w_ratio,
                                        !c.recompute || validated->has_split_backward());
  Evaluation out;
  out.schedule = std::move(schedule);
  out.cost = cost;
  out.sim = simulate(validated, cost);
  out.peak_bytes = fixed_bytes(scaled, options, c, *validated);
  for (size_t r = 0; r < out.peak_bytes.size(); ++r) {
    out.peak_bytes[r] += out.sim.ranks[r].peak_activations;
  }
  c.step_ms = out.sim.makespan;
  c.bubble_ratio = out.sim.bubble_ratio;
  c.peak_bytes = out.peak_bytes;
  return out;
}

bool within_limit(const Candidate& c, const PlannerOptions& options) {
  // Sums of the same bytes in another order (I and W apart, or B) differ in the last bits.
  return options.memory_limit_bytes <= 0 ||
         c.max_peak_bytes() <= options.memory_limit_bytes * (1 + kLimitSlack);
}

// zb-auto for the candidate: planned under each rank's budget. With recomputation the split
// backward holds more than a fused one (the memory model reserves at F the weight gradients'
// share that I's rerun makes, sim/cost_model.h), so 1F1B's order with each W right after its I
// holds more than 1F1B; zb-auto then also runs 1F1B's order with that I and W as one B (what the
// runtime runs them as), and keeps the faster of the two within the limit.
Evaluation evaluate_auto(const Profile& scaled, const PlannerOptions& options, Candidate& c) {
  const int P = options.workers;
  const CostModel cost = candidate_cost(scaled, c, options.mem_w_ratio, true);
  ScheduleOptions request;
  request.name = kAutoSchedule;
  request.ranks = P;
  request.microbatches = c.microbatches;
  request.chunks = c.chunks;
  request.costs = cost.stage_costs(P * c.chunks, P);
  request.rank_memory_limits = auto_schedule_limits(scaled, options, c, request.costs);
  check_schedule_size(P, c.chunks, c.microbatches);
  Schedule planned = make_schedule(request);
  Evaluation out = measure(scaled, options, c, validate(planned), planned);
  if (!c.recompute) return out;
  Candidate fused = c;
  Schedule one_f_one_b = make_1f1b(P, c.microbatches);
  one_f_one_b.name = kAutoSchedule;
  Evaluation other = measure(scaled, options, fused, validate(one_f_one_b), one_f_one_b);
  const bool auto_fits = within_limit(c, options), fused_fits = within_limit(fused, options);
  if (fused_fits && (!auto_fits || better(fused, c))) {
    c = fused;
    return other;
  }
  return out;
}

Evaluation evaluate_with(const Profile& scaled, const PlannerOptions& options, Candidate& c,
                         const ValidatedSchedule* cached) {
  if (c.schedule == kAutoSchedule) return evaluate_auto(scaled, options, c);
  if (cached != nullptr) return measure(scaled, options, c, *cached, Schedule{});
  Schedule made = generate(c, options.workers);
  Schedule runs = made;
  if (runs.replicated() && !has_grad_reductions(runs)) runs = add_grad_reductions(runs);
  return measure(scaled, options, c, validate(runs), std::move(made));
}

// Every distinct cut into `stages` stages the listed methods give, named by the methods that
// give it ("uniform/time").
std::vector<std::pair<std::string, std::vector<LayerRange>>> cuts(
    const Profile& profile, const PlannerOptions& options, const std::vector<std::string>& methods,
    int stages) {
  std::vector<std::pair<std::string, std::vector<LayerRange>>> out;
  for (const std::string& method : methods) {
    PartitionOptions request;
    request.method = method;
    if (method == "pipedream") {
      // PipeDream's memory-aware cut when it is a plain pipeline over the P workers.
      if (stages != options.workers) continue;
      request.levels = {{options.workers, kDefaultBandwidthBytesPerS}};
      request.memory_limit_bytes = options.memory_limit_bytes;
    } else {
      request.stages = stages;
    }
    Partition partition;
    try {
      partition = make_partition(profile, request);
    } catch (const UserError&) {
      continue;  // e.g. pipedream with nothing under the limit
    }
    std::vector<LayerRange> ranges;
    bool replicated = false;
    for (const StagePlan& stage : partition.stages) {
      ranges.emplace_back(stage.first_layer, stage.last_layer);
      replicated = replicated || stage.replicas > 1;
    }
    if (replicated || static_cast<int>(ranges.size()) != stages) continue;
    auto same =
        std::find_if(out.begin(), out.end(), [&](const auto& cut) { return cut.second == ranges; });
    if (same != out.end()) {
      same->first += "/" + method;
    } else {
      out.emplace_back(method, std::move(ranges));
    }
  }
  return out;
}

std::string megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  return text;
}

}  // namespace

double Candidate::max_peak_bytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

std::vector<std::string> synchronous_schedules() {
  std::vector<std::string> out;
  for (const ScheduleEntry& entry : schedule_registry()) {
    // avgpipe's copies never combine gradients: with one copy it is 1f1b, with more it is not
    // synchronous training.
    if (entry.update == WeightUpdate::kFlush && !entry.averages_copies) out.push_back(entry.name);
  }
  return out;
}

double optimizer_state_factor(const std::string& optimizer) {
  PPTRAIN_CHECK(optimizer == "adamw" || optimizer == "sgd",
                "--optimizer must be adamw (2 bytes of state per parameter byte) or sgd (1), got '",
                optimizer, "'");
  return optimizer == "adamw" ? 2 : 1;
}

std::vector<bool> recompute_choices(const std::string& recompute) {
  PPTRAIN_CHECK(recompute == "both" || recompute == "on" || recompute == "off",
                "--recompute must be both, on or off, got '", recompute, "'");
  if (recompute == "both") return {false, true};
  return {recompute == "on"};
}

void check_w_fraction_applies(const Profile& profile, double w_fraction) {
  PPTRAIN_CHECK(!profile.splits_backward(), "--w-fraction ", w_fraction,
                " applies to a profile with one backward time per layer, but ", profile.source,
                " gives I and W times of its own");
}

void check_planner_options(const PlannerOptions& options) {
  PPTRAIN_CHECK(options.workers >= 1 && options.workers <= kMaxRanks, "workers must be 1 .. ",
                kMaxRanks, ", got ", options.workers);
  PPTRAIN_CHECK(std::isfinite(options.memory_limit_bytes) && options.memory_limit_bytes >= 0,
                "memory limit must be >= 0 bytes, got ", options.memory_limit_bytes);
  PPTRAIN_CHECK(options.batch_size >= 0, "batch must be >= 1 samples, got ", options.batch_size);
  PPTRAIN_CHECK(options.profile_microbatch_size >= 0,
                "the profile's microbatch size must be >= 1 samples, got ",
                options.profile_microbatch_size);
  for (int m : options.microbatches) {
    PPTRAIN_CHECK(m >= 1, "microbatches must be >= 1, got ", m);
  }
  PPTRAIN_CHECK(
      options.min_microbatches >= 1 && options.min_microbatches <= options.max_microbatches,
      "microbatch range must be 1 <= low <= high, got ", options.min_microbatches, "-",
      options.max_microbatches);
  for (const std::string& method : options.partitions) check_partition_method(method);
  const std::vector<std::string> synchronous = synchronous_schedules();
  for (const std::string& name : options.schedules) {
    find_schedule(name);
    PPTRAIN_CHECK(
        std::find(synchronous.begin(), synchronous.end(), name) != synchronous.end(), "schedule '",
        name, "' is asynchronous; the planner compares synchronous schedules only (one of ",
        [&] {
          std::string list;
          for (const std::string& s : synchronous) list += (list.empty() ? "" : ", ") + s;
          return list;
        }(),
        ")");
  }
  PPTRAIN_CHECK(options.max_chunks >= 1, "max chunks must be >= 1, got ", options.max_chunks);
  PPTRAIN_CHECK(options.keep >= 1, "--top (candidates kept) must be >= 1, got ", options.keep);
  PPTRAIN_CHECK(options.optimizer_state_factor >= 0,
                "optimizer state per parameter byte must be >= 0, got ",
                options.optimizer_state_factor);
  PPTRAIN_CHECK(options.mem_w_ratio >= 0 && options.mem_w_ratio <= 1,
                "mem-w-ratio must be in [0, 1], got ", options.mem_w_ratio);
  PPTRAIN_CHECK(options.w_fraction >= 0 && options.w_fraction <= 1,
                "w-fraction must be in [0, 1] (the share of a layer's backward time that W takes), "
                "got ",
                options.w_fraction);
}

Evaluation evaluate(const Profile& profile, const PlannerOptions& options, Candidate& candidate) {
  const Resolved resolved = resolve(profile, options);
  candidate.microbatch_size = static_cast<double>(resolved.batch) / candidate.microbatches;
  const Profile scaled =
      scaled_profile(profile, candidate.microbatch_size / resolved.profile_size, options);
  return evaluate_with(scaled, options, candidate, nullptr);
}

PlanSearch search_plans(const Profile& profile, const PlannerOptions& options) {
  const Resolved resolved = resolve(profile, options);
  const int P = options.workers;
  const int layers = static_cast<int>(profile.layers.size());
  PlanSearch search;
  search.batch_size = resolved.batch;
  search.profile_microbatch_size = resolved.profile_size;
  std::vector<Candidate> fitting;
  // The hand-written generators ignore the costs: one validated schedule per (name, V, M).
  std::map<std::tuple<std::string, int, int>, std::optional<ValidatedSchedule>> schedules;
  std::map<int, std::vector<std::pair<std::string, std::vector<LayerRange>>>> cuts_of;
  for (int M : resolved.microbatches) {
    const double size = static_cast<double>(resolved.batch) / M;
    const Profile scaled = scaled_profile(profile, size / resolved.profile_size, options);
    for (const std::string& name : resolved.schedules) {
      const ScheduleEntry& entry = find_schedule(name);
      const int most = entry.max_chunks == 0 ? options.max_chunks
                                             : std::min(entry.max_chunks, options.max_chunks);
      for (int V = entry.min_chunks; V <= std::max(most, entry.min_chunks); ++V) {
        if (P * V > layers) break;
        if (!cuts_of.count(V)) cuts_of[V] = cuts(profile, options, resolved.partitions, P * V);
        const ValidatedSchedule* cached = nullptr;
        if (name != kAutoSchedule) {
          auto key = std::make_tuple(name, V, M);
          auto it = schedules.find(key);
          if (it == schedules.end()) {
            std::optional<ValidatedSchedule> made;
            try {
              Candidate shape;
              shape.schedule = name;
              shape.chunks = V;
              shape.microbatches = M;
              Schedule s = generate(shape, P);
              if (s.replicated() && !has_grad_reductions(s)) s = add_grad_reductions(s);
              made.emplace(validate(s));
            } catch (const UserError&) {
              // The generator does not apply to this P, V, M.
            }
            it = schedules.emplace(key, std::move(made)).first;
          }
          if (!it->second) continue;
          cached = &*it->second;
        }
        for (const auto& [method, ranges] : cuts_of[V]) {
          for (bool recompute : options.recompute) {
            Candidate c;
            c.partition = method;
            c.stage_layers = ranges;
            c.schedule = name;
            c.chunks = V;
            c.microbatches = M;
            c.microbatch_size = size;
            c.recompute = recompute;
            try {
              evaluate_with(scaled, options, c, cached);
            } catch (const UserError&) {
              continue;  // zb-auto refused these costs
            }
            ++search.evaluated;
            if (search.evaluated == 1 || c.max_peak_bytes() < search.smallest.max_peak_bytes()) {
              search.smallest = c;
            }
            if (!within_limit(c, options)) continue;
            ++search.fitting;
            fitting.push_back(std::move(c));
          }
        }
      }
    }
  }
  PPTRAIN_CHECK(search.evaluated > 0, profile.source, ": no schedule applies to ", P,
                " workers with the microbatch counts tried and ", layers, " layers");
  // The smallest limit that works, and the rank that needs it there.
  const std::vector<double>& peaks = search.smallest.peak_bytes;
  const auto needs_most = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
  PPTRAIN_CHECK(search.fitting > 0, "no plan fits the memory limit of ",
                megabytes(options.memory_limit_bytes), " (", options.memory_limit_bytes,
                " bytes) per rank; the smallest peak of the ", search.evaluated, " candidates is ",
                megabytes(search.smallest.max_peak_bytes()), " (",
                static_cast<long long>(std::ceil(search.smallest.max_peak_bytes())),
                " bytes, on rank ", needs_most, ": ", search.smallest.schedule,
                ", M=", search.smallest.microbatches,
                search.smallest.recompute ? ", recompute" : "", ")");
  std::stable_sort(fitting.begin(), fitting.end(), better);
  if (static_cast<int>(fitting.size()) > options.keep) fitting.resize(options.keep);
  search.ranked = std::move(fitting);
  return search;
}

}  // namespace pptrain
