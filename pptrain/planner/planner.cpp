#include "pptrain/planner/planner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/format.h"
#include "pptrain/common/once.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/workers.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/planner/schedule_request.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/memory_model.h"

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

// Bytes of a layer for microbatches `scale` times the profiled one: the part that does not grow
// with the samples (LayerProfile::stash_fixed_bytes, ...) as it is, the rest scaled.
void scale_bytes(double* bytes, double fixed, double scale) {
  if (*bytes > 0) *bytes = fixed + (*bytes - fixed) * scale;  // < 0: not measured, left so
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
    scale_bytes(&layer.stash_bytes, layer.stash_fixed_bytes, scale);
    scale_bytes(&layer.weight_stash_bytes, 0, scale);
    scale_bytes(&layer.forward_transient_bytes, layer.forward_transient_fixed_bytes, scale);
    scale_bytes(&layer.backward_transient_bytes, layer.backward_transient_fixed_bytes, scale);
  }
  out.input_bytes *= scale;
  out.target_bytes *= scale;
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

double largest(const Profile& profile, const LayerRange& range, double LayerProfile::*field) {
  double most = 0;
  for (int l = range.first; l <= range.second; ++l) most = std::max(most, profile.layers[l].*field);
  return most;
}

// Each stage's bytes for the memory model (sim/memory_model.h) from the scaled profile and the
// candidate's cost model (its activations and what W keeps, `cost`), with `microbatches` of
// inputs and targets in the step's batch.
std::vector<StageBytes> stage_bytes(const Profile& scaled, const PlannerOptions& options,
                                    const Candidate& c, const CostModel& cost) {
  const int stages = static_cast<int>(c.stage_layers.size());
  std::vector<StageBytes> out(stages);
  for (int s = 0; s < stages; ++s) {
    const LayerRange& range = c.stage_layers[s];
    StageBytes& b = out[s];
    b.weights = sum_layers(scaled, range, &LayerProfile::parameter_bytes);
    b.optimizer_state = options.optimizer_state_factor * b.weights;
    b.activation = cost.stage_activation[s];
    b.weight_stash = cost.stage_weight_stash[s];
    // A backward's working memory: its largest layer's, and with recomputation the stage's
    // forward graph made again first.
    b.transient = largest(scaled, range, &LayerProfile::backward_transient_bytes) +
                  (c.recompute ? sum_layers(scaled, range, &LayerProfile::stash_bytes) : 0);
    b.forward_transient = largest(scaled, range, &LayerProfile::forward_transient_bytes);
    b.message = range.first > 0 ? scaled.layers[range.first - 1].activation_bytes : 0;
  }
  out.front().data += c.microbatches * scaled.input_bytes;
  out.back().data += c.microbatches * scaled.target_bytes;
  return out;
}

// The memory model's parts of every rank for the candidate's schedule (its walk).
std::vector<RankMemory> rank_memory(const Profile& scaled, const PlannerOptions& options,
                                    const Candidate& c, const CostModel& cost,
                                    const MemoryWalk& walk, bool replicated) {
  MemoryRules rules;
  rules.gradient_buffers = replicated;  // the replicas' flat buffer
  return predict_memory(walk, stage_bytes(scaled, options, c, cost), VersionRule{}, rules);
}

// Rank r's memory limit in bytes: its own from a workers profile, else the common one; 0: none.
double rank_limit(const PlannerOptions& options, int r) {
  const std::vector<double>& own = options.rank_memory_limits;
  return !own.empty() && own[r] > 0 ? own[r] : options.memory_limit_bytes;
}

bool has_limit(const PlannerOptions& options) {
  for (int r = 0; r < options.workers; ++r) {
    if (rank_limit(options, r) > 0) return true;
  }
  return false;
}

// The limit rank r's plans are made under: its limit less the margin; 0: none.
double planning_limit(const PlannerOptions& options, int r) {
  return rank_limit(options, r) * (1 - options.memory_margin);
}

// Divides each stage's F, I and W by the speed of the slowest rank holding it (rank_speeds;
// `ranks_of(s)`: the ranks of stage s, two for a bidirectional schedule's stages, whose two
// directions the simulator times alike).
void apply_rank_speeds(const PlannerOptions& options,
                       const std::function<std::vector<int>(int)>& ranks_of, CostModel& cost) {
  if (options.rank_speeds.empty()) return;
  for (size_t s = 0; s < cost.stage_forward.size(); ++s) {
    double speed = 0;
    for (int r : ranks_of(static_cast<int>(s))) {
      speed = speed == 0 ? options.rank_speeds[r] : std::min(speed, options.rank_speeds[r]);
    }
    cost.stage_forward[s] /= speed;
    cost.stage_backward_input[s] /= speed;
    cost.stage_backward_weight[s] /= speed;
  }
}

bool better(const Candidate& a, const Candidate& b) {
  if (a.step_ms != b.step_ms) return a.step_ms < b.step_ms;
  return a.max_peak_bytes() < b.max_peak_bytes();
}

// The activation budget of each rank zb-auto plans under: the planning limit less what that
// rank holds besides activations (stage r on rank r: its weights, gradients, optimizer state and
// batch, a backward's working memory, and a message each way), in bytes; empty without a limit,
// or when some rank has not room for one microbatch of its stage (no schedule fits there:
// planned without a limit, the result is dropped as too large).
std::vector<double> auto_schedule_limits(const Profile& scaled, const PlannerOptions& options,
                                         const Candidate& c, const CostModel& cost,
                                         const StageCosts& costs) {
  if (!has_limit(options)) return {};
  const int ranks = costs.stages();
  const std::vector<StageBytes> bytes = stage_bytes(scaled, options, c, cost);
  std::vector<double> budgets(ranks);
  for (int r = 0; r < ranks; ++r) {
    if (rank_limit(options, r) <= 0) continue;  // 0: zb-auto's "no limit" for this rank
    const StageBytes& b = bytes[r];
    const double next_message = r + 1 < ranks ? bytes[r + 1].message : 0;
    budgets[r] = planning_limit(options, r) -
                 (2 * b.weights + b.optimizer_state + b.data +
                  std::max(b.transient, b.forward_transient) + b.message + next_message);
    if (budgets[r] < costs.activation[r]) return {};
  }
  return budgets;
}

// A schedule, validated, and its memory model's walk (of its lowered form, as the runtime runs it).
struct Made {
  Schedule made;  // as generated, for the plan's schedule file
  ValidatedSchedule validated;
  MemoryWalk walk;
};

Made made_for(Schedule made) {
  // One pipeline, synchronous: a replicated schedule's replicas sum their gradients.
  ValidatedSchedule validated = prepare_schedule(made, ScheduleRequest()).validated;
  MemoryWalk walk(validated);
  return {std::move(made), std::move(validated), std::move(walk)};
}

// The hand-written schedules by (name, V, M), each made, validated and walked once (their
// generators ignore the costs), and their figures. Shared by the search's threads: each entry
// is made once, by the first thread to ask; one asking meanwhile waits for it.
class Schedules {
 public:
  // `prune`: candidates above the limit are not simulated (the search's; measure()).
  Schedules(int ranks, bool prune) : ranks_(ranks), prune_(prune) {}
  bool prune() const { return prune_; }
  // The search compares figures; one candidate evaluated alone keeps its timeline to draw.
  Record record() const { return prune_ ? Record::kFigures : Record::kTimeline; }
  // nullptr where the generator does not apply to these P, V, M.
  const Made* find(const std::string& name, int chunks, int microbatches) {
    Entry<std::optional<Made>>& entry =
        entry_of(made_, std::make_tuple(name, chunks, microbatches));
    entry.once.call([&] {
      try {
        Candidate shape;
        shape.schedule = name;
        shape.chunks = chunks;
        shape.microbatches = microbatches;
        entry.value.emplace(made_for(generate(shape, ranks_)));
      } catch (const UserError&) {
      }
    });
    return entry.value ? &*entry.value : nullptr;
  }

  // The figures of candidate `c` on `made` (one of this cache's) under the scaled profile of its
  // M, measured once per cut and recomputation: zb-auto compares itself with the same candidates
  // of 1F1B, ZB-H1 and ZB-H2 that the search measures anyway.
  Candidate figures(const Profile& scaled, const PlannerOptions& options, const Candidate& c,
                    const Made& made);

 private:
  template <typename T>
  struct Entry {
    Once once;  // made by the first thread to ask (common/once.h)
    T value;
  };
  // The entry of `key`, made empty if new (a std::map's entries stay where they are).
  template <typename Map, typename Key>
  typename Map::mapped_type& entry_of(Map& map, const Key& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return map[key];
  }

  int ranks_;
  bool prune_;
  std::mutex mutex_;  // guards the two maps' structure; an entry's value is its once's
  std::map<std::tuple<std::string, int, int>, Entry<std::optional<Made>>> made_;
  std::map<std::tuple<const Made*, std::vector<LayerRange>, bool>, Entry<Candidate>> figures_;
};

bool within_limit(const Candidate& c, const PlannerOptions& options) {
  for (size_t r = 0; r < c.peak_bytes.size(); ++r) {
    const double limit = planning_limit(options, static_cast<int>(r));
    // Sums of the same bytes in another order (I and W apart, or B) differ in the last bits.
    if (limit > 0 && c.peak_bytes[r] > limit * (1 + kLimitSlack)) return false;
  }
  return true;
}

// A made schedule's memory model's peaks and simulation under the candidate's cost model; fills
// the candidate's predicted figures (Evaluation::schedule left empty). With `prune`, a candidate
// above the limit is not simulated (its peaks do not depend on times): its step_ms is infinite.
// `record`: the simulation's timeline is kept (to draw it) or only its figures.
Evaluation measure(const Profile& scaled, const PlannerOptions& options, Candidate& c,
                   const Made& made, Record record, bool prune = false) {
  const ValidatedSchedule& validated = made.validated;
  // Recomputation keeps less between F and B when the backward is not split.
  CostModel cost = candidate_cost(scaled, c, options.mem_w_ratio,
                                  !c.recompute || validated.given().has_split_backward());
  apply_rank_speeds(
      options, [&](int stage) { return validated.given().replicas_of(stage); }, cost);
  Evaluation out;
  out.cost = cost;
  out.memory = rank_memory(scaled, options, c, cost, made.walk, validated.given().replicated());
  for (const RankMemory& rank : out.memory) out.peak_bytes.push_back(rank.total());
  c.peak_bytes = out.peak_bytes;
  if (prune && !within_limit(c, options)) {
    c.step_ms = std::numeric_limits<double>::infinity();
    c.bubble_ratio = 0;
    c.simulated = false;
    return out;
  }
  out.sim = simulate(validated, cost, VersionRule{}, record);
  c.step_ms = out.sim.makespan;
  c.bubble_ratio = out.sim.bubble_ratio;
  c.simulated = true;
  return out;
}

Candidate Schedules::figures(const Profile& scaled, const PlannerOptions& options,
                             const Candidate& c, const Made& made) {
  Entry<Candidate>& entry = entry_of(figures_, std::make_tuple(&made, c.stage_layers, c.recompute));
  entry.once.call([&] {
    entry.value = c;
    measure(scaled, options, entry.value, made, Record::kFigures, prune_);
  });
  Candidate out = c;
  out.step_ms = entry.value.step_ms;
  out.bubble_ratio = entry.value.bubble_ratio;
  out.peak_bytes = entry.value.peak_bytes;
  out.simulated = entry.value.simulated;
  return out;
}

// zb-auto for the candidate: planned under each rank's activation budget. What else a rank holds
// in flight (messages) depends on the order, so the memory model checks the planned schedule,
// and a rank above the limit plans again with its budget less the excess, for a few rounds.
// zb-auto never loses to 1F1B, ZB-H1 or ZB-H2 where they fit in the generator's own model
// (auto_schedule.h); here, in the memory model's, it is held to that by also running their
// orders (and, with recomputation, 1F1B's order as fused B's, which the split backward's memory
// model holds more for: I's rerun makes the weight gradients' share, reserved at F) and keeping
// the fastest within the limit.
Evaluation evaluate_auto(const Profile& scaled, const PlannerOptions& options, Candidate& c,
                         Schedules& schedules) {
  constexpr int kRounds = 4;
  const int P = options.workers;
  CostModel cost = candidate_cost(scaled, c, options.mem_w_ratio, true);
  // zb-auto orders by these times; measure() then simulates its schedule's own placement.
  apply_rank_speeds(
      options, [P](int stage) { return std::vector<int>{stage % P}; }, cost);
  ScheduleOptions request;
  request.name = kAutoSchedule;
  request.ranks = P;
  request.microbatches = c.microbatches;
  request.chunks = c.chunks;
  request.costs = cost.stage_costs(P * c.chunks, P);
  request.rank_memory_limits = auto_schedule_limits(scaled, options, c, cost, request.costs);
  check_schedule_size(P, c.chunks, c.microbatches);
  const Candidate shape = c;
  Evaluation out;
  std::shared_ptr<const Schedule> chosen;
  for (int round = 0; round < kRounds; ++round) {
    Made planned = made_for(make_schedule(request));
    c = shape;
    out = measure(scaled, options, c, planned, schedules.record(), schedules.prune());
    chosen = std::make_shared<const Schedule>(std::move(planned.made));
    std::vector<double>& budgets = request.rank_memory_limits;
    if (budgets.empty() || within_limit(c, options)) break;
    bool room = true;
    for (int r = 0; r < P; ++r) {
      if (budgets[r] <= 0) continue;  // no limit on this rank
      budgets[r] -= std::max(0.0, c.peak_bytes[r] - planning_limit(options, r));
      room = room && budgets[r] >= request.costs.activation[r];
    }
    if (!room) break;
  }
  const Made* fastest = nullptr;
  for (const char* name : {"1f1b", "zb-h1", "zb-h2"}) {
    if (c.chunks != 1) break;
    const Made* order = schedules.find(name, 1, c.microbatches);
    if (order == nullptr) continue;
    const Candidate other = schedules.figures(scaled, options, shape, *order);
    if (within_limit(other, options) && (!within_limit(c, options) || better(other, c))) {
      c = other;
      fastest = order;
    }
  }
  if (fastest != nullptr) {
    Schedule order = fastest->made;
    order.name = kAutoSchedule;
    chosen = std::make_shared<const Schedule>(std::move(order));
    // The search keeps the figures c has from above; a candidate evaluated alone is simulated
    // again for its timeline.
    if (!schedules.prune()) out = measure(scaled, options, c, *fastest, schedules.record());
  }
  c.made = chosen;
  if (!schedules.prune()) out.schedule = *chosen;
  return out;
}

Evaluation evaluate_with(const Profile& scaled, const PlannerOptions& options, Candidate& c,
                         Schedules& schedules) {
  if (c.schedule == kAutoSchedule) return evaluate_auto(scaled, options, c, schedules);
  const Made* made = schedules.find(c.schedule, c.chunks, c.microbatches);
  if (made == nullptr) generate(c, options.workers);  // the generator's UserError
  PPTRAIN_ASSERT(made != nullptr, "no ", c.schedule, " schedule and no error from its generator");
  Evaluation out = measure(scaled, options, c, *made, schedules.record());
  out.schedule = made->made;
  return out;
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
      if (method == "time" && !options.rank_speeds.empty()) {
        for (int s = 0; s < stages; ++s) {
          request.stage_speeds.push_back(options.rank_speeds[s % options.workers]);
        }
      }
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

// "1234.5": bytes in MB, one decimal; megabytes() adds the unit.
std::string megabyte_figure(double bytes) {
  std::string text;
  append_format(text, "%.1f", bytes / 1e6);
  return text;
}

}  // namespace

std::string megabytes(double bytes) {
  return megabyte_figure(bytes) + " MB";
}

double rank_memory_limit(const PlannerOptions& options, int rank) {
  return rank_limit(options, rank);
}

bool fits_memory_limits(const PlannerOptions& options, const std::vector<double>& peak_bytes) {
  Candidate c;
  c.peak_bytes = peak_bytes;
  return within_limit(c, options);
}

double Candidate::max_peak_bytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

std::vector<std::string> synchronous_schedules() {
  std::vector<std::string> out;
  for (const ScheduleEntry& entry : schedule_registry()) {
    // avgpipe's copies never combine gradients: with one copy it is 1f1b, with more it is not
    // synchronous training.
    if (!entry.asynchronous() && !entry.averages_copies && entry.planned) {
      out.push_back(entry.name);
    }
  }
  return out;
}

double optimizer_state_factor(const std::string& optimizer) {
  OptimizerOptions options;  // sgd with its default momentum
  options.kind = optimizer;
  check_optimizer(options, OptionNames());
  return state_bytes_per_parameter_byte(options);
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
  PPTRAIN_CHECK(options.copies >= 1 && options.copies <= kMaxRanks,
                "data-parallel copies must be 1 .. ", kMaxRanks, ", got ", options.copies);
  for (const auto* per_rank : {&options.rank_speeds, &options.rank_memory_limits}) {
    PPTRAIN_CHECK(
        per_rank->empty() || static_cast<int>(per_rank->size()) == options.workers * options.copies,
        "the workers profile has ", per_rank->size(), " workers, but the plan is for ",
        options.workers * options.copies);
  }
  for (size_t r = 0; r < options.rank_speeds.size(); ++r) {
    PPTRAIN_CHECK(std::isfinite(options.rank_speeds[r]) && options.rank_speeds[r] > 0, "rank ", r,
                  ": speed must be > 0, got ", options.rank_speeds[r]);
  }
  for (size_t r = 0; r < options.rank_memory_limits.size(); ++r) {
    PPTRAIN_CHECK(
        std::isfinite(options.rank_memory_limits[r]) && options.rank_memory_limits[r] >= 0, "rank ",
        r, ": memory limit must be >= 0 bytes, got ", options.rank_memory_limits[r]);
  }
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
  PPTRAIN_CHECK(options.jobs >= 0 && options.jobs <= 1024,
                "--jobs must be 0 (the machine's cores) .. 1024 threads, got ", options.jobs);
  PPTRAIN_CHECK(options.optimizer_state_factor >= 0,
                "optimizer state per parameter byte must be >= 0, got ",
                options.optimizer_state_factor);
  PPTRAIN_CHECK(options.memory_margin >= 0 && options.memory_margin < 1,
                "memory margin must be in [0, 1) (the share of the limit kept free), got ",
                options.memory_margin);
  PPTRAIN_CHECK(options.mem_w_ratio >= 0 && options.mem_w_ratio <= 1,
                "mem-w-ratio must be in [0, 1], got ", options.mem_w_ratio);
  PPTRAIN_CHECK(options.w_fraction >= 0 && options.w_fraction <= 1,
                "w-fraction must be in [0, 1] (the share of a layer's backward time that W takes), "
                "got ",
                options.w_fraction);
}

DpShares dp_shares_for(const Profile& profile, const std::vector<LayerRange>& stage_layers,
                       const std::vector<int>& stage_to_rank, const std::vector<double>& speeds,
                       int batch_size, int microbatches) {
  const int P = *std::max_element(stage_to_rank.begin(), stage_to_rank.end()) + 1;
  std::vector<double> rank_work_ms(P, 0);  // per microbatch of the profile's size
  for (size_t s = 0; s < stage_layers.size(); ++s) {
    for (int l = stage_layers[s].first; l <= stage_layers[s].second; ++l) {
      rank_work_ms[stage_to_rank[s]] += profile.layers[l].compute_ms();
    }
  }
  const std::vector<double> rates = copy_rates(rank_work_ms, speeds);
  const int D = static_cast<int>(rates.size());
  DpShares out{{}, slowest_copy_time(std::vector<int>(D, batch_size / D), rates)};
  const std::vector<int> shares = choose_dp_shares(rates, batch_size, microbatches);
  const double step = slowest_copy_time(shares, rates);
  if (step < out.step * (1 - kDpSharesGain)) out = {shares, step};
  return out;
}

PlannerOptions one_copy(const PlannerOptions& options) {
  if (options.copies == 1) return options;
  check_planner_options(options);
  const int D = options.copies, P = options.workers;
  PPTRAIN_CHECK(options.batch_size % D == 0, "batch ", options.batch_size,
                " is not a multiple of the ", D, " data-parallel copies (each copy plans its 1/", D,
                ")");
  PlannerOptions one = options;
  one.copies = 1;
  one.batch_size = options.batch_size / D;
  for (int p = 0; p < P && !options.rank_speeds.empty(); ++p) {
    for (int d = 1; d < D; ++d) {
      one.rank_speeds[p] = std::min(one.rank_speeds[p], options.rank_speeds[d * P + p]);
    }
  }
  for (int p = 0; p < P && !options.rank_memory_limits.empty(); ++p) {
    for (int d = 1; d < D; ++d) {
      const double limit = options.rank_memory_limits[d * P + p];
      double& smallest = one.rank_memory_limits[p];
      if (limit > 0) smallest = smallest == 0 ? limit : std::min(smallest, limit);
    }
  }
  one.rank_speeds.resize(options.rank_speeds.empty() ? 0 : P);
  one.rank_memory_limits.resize(options.rank_memory_limits.empty() ? 0 : P);
  return one;
}

std::vector<std::vector<int>> distinct_placements(int workers, const std::vector<double>& speeds,
                                                  const std::vector<double>& limits) {
  std::vector<int> order(workers);
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<int>> out;
  std::set<std::vector<std::pair<double, double>>> seen;  // what each rank gets
  do {
    std::vector<std::pair<double, double>> gets;
    for (int w : order) {
      gets.emplace_back(speeds.empty() ? 1 : speeds[w], limits.empty() ? 0 : limits[w]);
    }
    if (seen.insert(gets).second) out.push_back(order);
  } while (static_cast<int>(out.size()) < kMaxPlacements &&
           std::next_permutation(order.begin(), order.end()));
  return out;
}

PlannerOptions placed_options(const PlannerOptions& options, const std::vector<int>& placement) {
  PlannerOptions out = options;
  for (size_t r = 0; r < placement.size(); ++r) {
    if (!options.rank_speeds.empty()) out.rank_speeds[r] = options.rank_speeds[placement[r]];
    if (!options.rank_memory_limits.empty()) {
      out.rank_memory_limits[r] = options.rank_memory_limits[placement[r]];
    }
  }
  return out;
}

Evaluation evaluate(const Profile& profile, const PlannerOptions& given, Candidate& candidate) {
  const PlannerOptions options = placed_options(one_copy(given), candidate.placement);
  const Resolved resolved = resolve(profile, options);
  candidate.microbatch_size = static_cast<double>(resolved.batch) / candidate.microbatches;
  const Profile scaled =
      scaled_profile(profile, candidate.microbatch_size / resolved.profile_size, options);
  Schedules schedules(options.workers, false);
  if (candidate.schedule == kAutoSchedule && candidate.made) {
    const Made made = made_for(*candidate.made);  // as the search planned it
    Evaluation out = measure(scaled, options, candidate, made, schedules.record());
    out.schedule = made.made;
    return out;
  }
  return evaluate_with(scaled, options, candidate, schedules);
}

std::vector<std::vector<double>> cut_peak_bytes(const Profile& profile,
                                                const PlannerOptions& options,
                                                const Candidate& shape,
                                                const std::vector<std::vector<LayerRange>>& cuts,
                                                bool gradient_buffers) {
  const Resolved resolved = resolve(profile, options);
  Candidate c = shape;
  c.microbatch_size = static_cast<double>(resolved.batch) / c.microbatches;
  const Profile scaled =
      scaled_profile(profile, c.microbatch_size / resolved.profile_size, options);
  Schedules schedules(options.workers, true);
  const Made* made = nullptr;
  if (c.schedule != kAutoSchedule) {
    made = schedules.find(c.schedule, c.chunks, c.microbatches);
    if (made == nullptr) generate(c, options.workers);  // the generator's UserError
  }
  std::vector<std::vector<double>> out;
  for (const std::vector<LayerRange>& cut : cuts) {
    c.stage_layers = cut;
    if (made == nullptr) {
      evaluate_auto(scaled, options, c, schedules);
      out.push_back(c.peak_bytes);
      continue;
    }
    const CostModel cost =
        candidate_cost(scaled, c, options.mem_w_ratio,
                       !c.recompute || made->validated.given().has_split_backward());
    std::vector<double> peaks;
    for (const RankMemory& rank :
         rank_memory(scaled, options, c, cost, made->walk,
                     gradient_buffers || made->validated.given().replicated())) {
      peaks.push_back(rank.total());
    }
    out.push_back(std::move(peaks));
  }
  return out;
}

namespace {

using Cuts = std::vector<std::pair<std::string, std::vector<LayerRange>>>;

// The chunk counts V the schedule takes, up to max_chunks, with P x V stages of at least a layer.
std::vector<int> chunk_counts(const std::string& name, const PlannerOptions& options, int layers) {
  const ScheduleEntry& entry = find_schedule(name);
  const int most =
      entry.max_chunks == 0 ? options.max_chunks : std::min(entry.max_chunks, options.max_chunks);
  std::vector<int> out;
  for (int V = entry.min_chunks; V <= std::max(most, entry.min_chunks); ++V) {
    if (options.workers * V > layers) break;
    out.push_back(V);
  }
  return out;
}

// Every candidate of one schedule at one microbatch count M that applies, in the search's order
// (V, cut, recomputation), each evaluated on `scaled` (the profile at M's microbatch size);
// those above the limit are not simulated.
std::vector<Candidate> candidates_of(const Profile& scaled, const PlannerOptions& options,
                                     const std::string& name, int M, double microbatch_size,
                                     const std::map<int, Cuts>& cuts_of, Schedules& schedules) {
  const int layers = static_cast<int>(scaled.layers.size());
  std::vector<Candidate> out;
  for (int V : chunk_counts(name, options, layers)) {
    if (name != kAutoSchedule && schedules.find(name, V, M) == nullptr) continue;
    for (const auto& [method, ranges] : cuts_of.at(V)) {
      for (bool recompute : options.recompute) {
        Candidate c;
        c.partition = method;
        c.stage_layers = ranges;
        c.schedule = name;
        c.chunks = V;
        c.microbatches = M;
        c.microbatch_size = microbatch_size;
        c.recompute = recompute;
        try {
          if (name == kAutoSchedule) {
            evaluate_auto(scaled, options, c, schedules);
          } else {
            c = schedules.figures(scaled, options, c, *schedules.find(name, V, M));
          }
        } catch (const UserError&) {
          continue;  // zb-auto refused these costs
        }
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

// Runs work(i) for i in 0 .. count - 1 on `jobs` threads (0: the machine's cores). An exception
// of work(i) is rethrown after every thread has stopped (the lowest i's, whatever the timing).
void for_each_index(int count, int jobs, const std::function<void(int)>& work) {
  if (jobs <= 0) jobs = std::max(1u, std::thread::hardware_concurrency());
  jobs = std::min(jobs, count);
  if (jobs <= 1) {
    for (int i = 0; i < count; ++i) work(i);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::exception_ptr> errors(count);
  const auto run = [&] {
    for (int i = next++; i < count; i = next++) {
      try {
        work(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  // This thread is one of the `jobs`: its heap is warm (and in huge pages, common/malloc.h).
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t) threads.emplace_back(run);
  run();
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace

// The search for one placement (the options as its ranks see them).
PlanSearch search_placed(const Profile& profile, const PlannerOptions& options) {
  const Resolved resolved = resolve(profile, options);
  const int P = options.workers;
  const int layers = static_cast<int>(profile.layers.size());
  PlanSearch search;
  search.batch_size = resolved.batch;
  search.profile_microbatch_size = resolved.profile_size;
  std::map<int, Cuts> cuts_of;
  for (const std::string& name : resolved.schedules) {
    for (int V : chunk_counts(name, options, layers)) {
      if (!cuts_of.count(V)) cuts_of[V] = cuts(profile, options, resolved.partitions, P * V);
    }
  }
  // The search's units, each a schedule at one M (its every V, cut and recomputation), in the
  // serial order: M, then schedule. They run on `jobs` threads, those of one M sharing its
  // Schedules (whose entries are made once whoever asks first), the largest M first: a unit's work
  // grows with M, and the largest started last would leave the other threads idle. The results are
  // taken in the serial order, so that they do not depend on the number of threads.
  const int counts = static_cast<int>(resolved.microbatches.size());
  std::vector<Profile> scaled;  // [M index] the profile at M's microbatch size
  for (int M : resolved.microbatches) {
    const double size = static_cast<double>(resolved.batch) / M;
    scaled.push_back(scaled_profile(profile, size / resolved.profile_size, options));
  }
  std::vector<std::pair<int, int>> units;  // (M index, schedule index)
  for (int i = 0; i < counts; ++i) {
    for (int n = 0; n < static_cast<int>(resolved.schedules.size()); ++n) units.emplace_back(i, n);
  }
  std::vector<int> largest_first(units.size());
  std::iota(largest_first.begin(), largest_first.end(), 0);
  std::stable_sort(largest_first.begin(), largest_first.end(), [&](int a, int b) {
    return resolved.microbatches[units[a].first] > resolved.microbatches[units[b].first];
  });
  // [M index] the schedules of that M and their figures, dropped when its last unit ends (the
  // memory of one M's is then reused by the next's instead of taking fresh pages).
  std::vector<std::unique_ptr<Schedules>> schedules_of(counts);
  std::vector<std::atomic<int>> units_left(counts);
  for (int i = 0; i < counts; ++i) {
    schedules_of[i] = std::make_unique<Schedules>(P, true);
    units_left[i] = static_cast<int>(resolved.schedules.size());
  }
  std::vector<std::vector<Candidate>> of_unit(units.size());
  for_each_index(static_cast<int>(units.size()), options.jobs, [&](int k) {
    const auto [i, n] = units[largest_first[k]];
    const int M = resolved.microbatches[i];
    of_unit[largest_first[k]] =
        candidates_of(scaled[i], options, resolved.schedules[n], M,
                      static_cast<double>(resolved.batch) / M, cuts_of, *schedules_of[i]);
    if (--units_left[i] == 0) schedules_of[i].reset();
  });
  std::vector<Candidate> fitting;
  for (std::vector<Candidate>& candidates : of_unit) {
    for (Candidate& c : candidates) {
      ++search.evaluated;
      search.simulated += c.simulated ? 1 : 0;
      if (search.evaluated == 1 || c.max_peak_bytes() < search.smallest.max_peak_bytes()) {
        search.smallest = c;
      }
      if (!within_limit(c, options)) continue;
      ++search.fitting;
      fitting.push_back(std::move(c));
    }
  }
  PPTRAIN_CHECK(search.evaluated > 0, profile.source, ": no schedule applies to ", P,
                " workers with the microbatch counts tried and ", layers, " layers");
  // The smallest limit that works, and the rank that needs it there.
  const std::vector<double>& peaks = search.smallest.peak_bytes;
  const auto needs_most = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
  if (search.fitting == 0 && !options.rank_memory_limits.empty()) {
    // Per-rank limits: the rank furthest over its own in the candidate of the smallest peak.
    int over = 0;
    double worst = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < P; ++r) {
      const double limit = planning_limit(options, r);
      if (limit > 0 && peaks[r] - limit > worst) {
        worst = peaks[r] - limit;
        over = r;
      }
    }
    throw UserError(detail::concat(
        "no plan fits rank ", over, "'s memory limit of ", megabytes(rank_limit(options, over)),
        " less its margin of ", options.memory_margin * 100,
        "%; the smallest limit that works on "
        "rank ",
        over, " is ", megabytes(peaks[over] / (1 - options.memory_margin)), " (",
        static_cast<long long>(std::ceil(peaks[over] / (1 - options.memory_margin))),
        " bytes: ", search.smallest.schedule, ", M=", search.smallest.microbatches,
        search.smallest.recompute ? ", recompute" : "", ")"));
  }
  PPTRAIN_CHECK(search.fitting > 0, "no plan fits the memory limit of ",
                megabytes(options.memory_limit_bytes), " (", options.memory_limit_bytes,
                " bytes) per rank less its margin of ", options.memory_margin * 100,
                "%; the smallest peak of the ", search.evaluated, " candidates is ",
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

// PlannerOptions::copies > 1: one copy planned on its 1/D of the batch, each pipeline rank at
// its slowest copy's speed and smallest memory limit, then each ranked candidate's shares of the
// whole batch for the copies' own paces. Schedules whose stages are replicated already (chimera,
// gems, bitpipe), which --dp does not run, are left out.
PlanSearch search_copies(const Profile& profile, const PlannerOptions& options) {
  PlannerOptions one = one_copy(options);
  one.keep = std::numeric_limits<int>::max();  // the ranked list is cut once they are left out
  PlanSearch search = search_placed(profile, one);
  std::vector<Candidate> ranked;
  for (Candidate& c : search.ranked) {
    if (static_cast<int>(ranked.size()) == options.keep) break;
    const Schedule schedule = c.made ? *c.made : generate(c, options.workers);
    if (schedule.replicated()) continue;
    if (!options.rank_speeds.empty()) {
      c.dp_shares =
          dp_shares_for(profile, c.stage_layers, schedule.stage_to_rank, options.rank_speeds,
                        search.batch_size * options.copies, c.microbatches)
              .shares;
    }
    ranked.push_back(std::move(c));
  }
  PPTRAIN_CHECK(!ranked.empty(), "no plan for ", options.copies,
                " data-parallel copies: every candidate that fits replicates its stages, which "
                "data-parallel copies do not run");
  search.ranked = std::move(ranked);
  return search;
}

PlanSearch search_plans(const Profile& profile, const PlannerOptions& options) {
  if (options.copies > 1) return search_copies(profile, options);
  if (options.rank_speeds.empty() && options.rank_memory_limits.empty()) {
    return search_placed(profile, options);
  }
  check_planner_options(options);
  const std::vector<std::vector<int>> placements =
      distinct_placements(options.workers, options.rank_speeds, options.rank_memory_limits);
  if (placements.size() == 1) return search_placed(profile, options);
  std::optional<PlanSearch> all;
  std::optional<UserError> identity_error;
  std::vector<Candidate> fitting;
  for (const std::vector<int>& placement : placements) {
    PlanSearch one;
    try {
      one = search_placed(profile, placed_options(options, placement));
    } catch (const UserError& e) {
      if (!identity_error) identity_error = e;
      continue;
    }
    const bool identity = std::is_sorted(placement.begin(), placement.end());
    for (Candidate& c : one.ranked) {
      if (!identity) c.placement = placement;
      fitting.push_back(std::move(c));
    }
    if (!all) {
      all = std::move(one);
      continue;
    }
    all->evaluated += one.evaluated;
    all->simulated += one.simulated;
    all->fitting += one.fitting;
  }
  if (!all) throw *identity_error;
  // The identity's candidates first, so that a tie keeps rank r on worker r.
  std::stable_sort(fitting.begin(), fitting.end(), better);
  if (static_cast<int>(fitting.size()) > options.keep) fitting.resize(options.keep);
  all->ranked = std::move(fitting);
  return *all;
}

std::string plan_table_text(const Profile& profile, const PlannerOptions& options,
                            const PlanSearch& search, double seconds) {
  std::string out;
  const std::string limit =
      options.memory_limit_bytes > 0
          ? "limit " + megabytes(options.memory_limit_bytes) + " per rank (planned under " +
                megabyte_figure(options.memory_limit_bytes * (1 - options.memory_margin)) + ")"
          : "no memory limit";
  if (options.copies == 1) {
    append_format(out,
                  "plan for %s (%zu layers) on %d workers, %s, batch %d (profiled microbatch %d)\n",
                  profile.source.c_str(), profile.layers.size(), options.workers, limit.c_str(),
                  search.batch_size, search.profile_microbatch_size);
  } else {
    append_format(out,
                  "plan for %s (%zu layers) on %d workers x %d copies (--dp), %s, batch %d (%d "
                  "per copy at equal shares; profiled microbatch %d)\n",
                  profile.source.c_str(), profile.layers.size(), options.workers, options.copies,
                  limit.c_str(), search.batch_size * options.copies, search.batch_size,
                  search.profile_microbatch_size);
    append_format(out,
                  "each copy planned at its pipeline ranks' slowest copy's speeds and equal shares "
                  "(the step ms below); shares: each copy's samples for its own pace\n");
  }
  if (!options.rank_speeds.empty()) {
    append_format(out, "workers:");
    for (int r = 0; r < static_cast<int>(options.rank_speeds.size()); ++r) {
      const double limit = options.rank_memory_limits[r];
      append_format(out, "%s rank %d speed %.2f%s", r == 0 ? "" : ",", r, options.rank_speeds[r],
                    limit > 0 ? (" limit " + megabytes(limit)).c_str() : "");
    }
    append_format(out, "\n");
  }
  if (profile.splits_backward()) {
    append_format(out, "backward split: the profile's own I and W times\n");
  } else {
    append_format(
        out,
        "backward split: assumed W = %.2f of each layer's backward, I the rest (the profile gives "
        "one backward time; --w-fraction)\n",
        options.w_fraction);
  }
  append_format(
      out,
      "%d candidates evaluated in %.2f s, %d fit (%d simulated: not those above the limit)\n\n",
      search.evaluated, seconds, search.fitting, search.simulated);
  // Unequal workers add the placement: the worker of each pipeline rank; copies their shares.
  const bool placed = !options.rank_speeds.empty() || !options.rank_memory_limits.empty();
  const char* last_column = options.copies > 1 ? "  shares" : placed ? "  placement" : "";
  append_format(out, "%3s  %-29s  %-16s  %2s  %5s  %9s  %12s  %7s  %12s%s\n", "#", "partition",
                "schedule", "V", "M", "recompute", "step ms", "bubble", "peak MB/rank",
                last_column);
  for (size_t i = 0; i < search.ranked.size(); ++i) {
    const Candidate& c = search.ranked[i];
    std::string placement;
    if (options.copies > 1) {
      placement =
          "  " + (c.dp_shares.empty() ? std::string("equal") : format_dp_shares(c.dp_shares));
    } else if (placed) {
      std::vector<int> identity(options.workers);
      std::iota(identity.begin(), identity.end(), 0);
      placement = "  " + format_placement(c.placement.empty() ? identity : c.placement);
    }
    append_format(out, "%3zu  %-29s  %-16s  %2d  %5d  %9s  %12.3f  %7.4f  %12s%s\n", i + 1,
                  c.partition.c_str(), c.schedule.c_str(), c.chunks, c.microbatches,
                  c.recompute ? "yes" : "no", c.step_ms, c.bubble_ratio,
                  megabyte_figure(c.max_peak_bytes()).c_str(), placement.c_str());
  }
  return out;
}

}  // namespace pptrain
