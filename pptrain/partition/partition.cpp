#include "pptrain/partition/partition.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/partition/workers.h"

namespace pptrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Prefix sums over the layers, so any range costs O(1).
class LayerSums {
 public:
  explicit LayerSums(const Profile& profile) {
    const size_t n = profile.layers.size();
    compute_s_.assign(n + 1, 0);
    parameter_bytes_.assign(n + 1, 0);
    stash_bytes_.assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const LayerProfile& l = profile.layers[i];
      compute_s_[i + 1] = compute_s_[i] + l.compute_ms() / 1000.0;
      parameter_bytes_[i + 1] = parameter_bytes_[i] + l.parameter_bytes;
      stash_bytes_[i + 1] = stash_bytes_[i] + l.stash_bytes;
      cut_bytes_.push_back(l.activation_bytes);
    }
  }
  int num_layers() const { return static_cast<int>(cut_bytes_.size()); }
  // Ranges are inclusive: layers first..last.
  double compute_s(int first, int last) const { return compute_s_[last + 1] - compute_s_[first]; }
  double parameter_bytes(int first, int last) const {
    return parameter_bytes_[last + 1] - parameter_bytes_[first];
  }
  double stash_bytes(int first, int last) const {
    return stash_bytes_[last + 1] - stash_bytes_[first];
  }
  // Bytes crossing the cut after `layer`.
  double cut_bytes(int layer) const { return cut_bytes_[layer]; }

 private:
  std::vector<double> compute_s_, parameter_bytes_, stash_bytes_;  // [L + 1], prefix sums
  std::vector<double> cut_bytes_;                                  // [L]
};

// The `time` cost of one unreplicated stage: forward+backward, or, with a bandwidth, the larger
// of that and the activation+gradient transfer (2 x bytes) at either of its cuts; the compute
// on a worker of relative `speed` takes 1/speed as long (workers.h). Transfers
// overlap compute, as in PipeDream's model and our simulator; a link that is slower than the
// compute becomes the bottleneck instead.
double time_cost(const LayerSums& sums, int first, int last, double bandwidth, double speed = 1) {
  double t = sums.compute_s(first, last) / speed;
  if (bandwidth > 0) {
    if (first > 0) t = std::max(t, 2 * sums.cut_bytes(first - 1) / bandwidth);
    if (last < sums.num_layers() - 1) t = std::max(t, 2 * sums.cut_bytes(last) / bandwidth);
  }
  return t;
}

// Cuts layers 0..L-1 into exactly `parts` non-empty ranges minimising the largest cost(p, i, j)
// of stage p holding layers i..j, by dynamic programming over (stage, last layer). `bound(p, i,
// j)` <= cost(p, i, j) and must not shrink as i decreases; once it reaches the best value found,
// no longer last stage can win. Ties keep the shortest last stage. Returns the first layer of
// each range.
template <typename Cost, typename Bound>
std::vector<int> min_max_split(int num_layers, int parts, Cost cost, Bound bound) {
  const int L = num_layers;
  // best[p][j]: smallest bottleneck covering layers 0..j with p+1 stages; start[p][j]: the first
  // layer of stage p in that solution.
  std::vector<std::vector<double>> best(parts, std::vector<double>(L, kInf));
  std::vector<std::vector<int>> start(parts, std::vector<int>(L, 0));
  for (int j = 0; j < L; ++j) best[0][j] = cost(0, 0, j);
  for (int p = 1; p < parts; ++p) {
    // Stage p ends at j; stages 0..p-1 need p layers before it, stages after it one layer each.
    for (int j = p; j <= L - parts + p; ++j) {
      double b = kInf;
      int arg = j;
      for (int i = j; i >= p; --i) {
        if (bound(p, i, j) >= b) break;
        double v = std::max(best[p - 1][i - 1], cost(p, i, j));
        if (v < b) {
          b = v;
          arg = i;
        }
      }
      best[p][j] = b;
      start[p][j] = arg;
    }
  }
  std::vector<int> firsts(parts);
  for (int p = parts - 1, j = L - 1; p >= 0; --p) {
    firsts[p] = p == 0 ? 0 : start[p][j];
    j = firsts[p] - 1;
  }
  return firsts;
}

// Fills compute_s, the bottleneck and the speed-up of unreplicated stages given by first layers,
// on workers of the given speeds (empty: all 1).
Partition unreplicated_partition(const std::string& method, const LayerSums& sums,
                                 const std::vector<int>& firsts, double bandwidth,
                                 const std::vector<double>& speeds) {
  Partition out;
  out.method = method;
  const int L = sums.num_layers();
  for (size_t s = 0; s < firsts.size(); ++s) {
    int last = s + 1 < firsts.size() ? firsts[s + 1] - 1 : L - 1;
    const double speed = speeds.empty() ? 1.0 : speeds[s];
    out.stages.push_back({firsts[s], last, 1, sums.compute_s(firsts[s], last) / speed});
    out.time_per_minibatch_s =
        std::max(out.time_per_minibatch_s, time_cost(sums, firsts[s], last, bandwidth, speed));
  }
  double single = sums.compute_s(0, L - 1);
  out.speedup_vs_single = out.time_per_minibatch_s > 0 ? single / out.time_per_minibatch_s : 1;
  return out;
}

// ---- PipeDream ---------------------------------------------------------------------------

// One entry of PipeDream's A[i][j][m]: the best pipeline over layers i..j on m workers of one
// level. Its last stage is split+1..j on `replicas` workers; the rest is A[i][split][rest].
struct Cell {
  double time_s = kInf;  // the slowest stage's time per input; kInf = no feasible pipeline
  int split = -1;        // -1: the whole range is one stage
  int rest = 0;          // workers left for layers i..split
  int replicas = 0;      // workers of the last stage
};

class LevelTable {
 public:
  LevelTable(int rows, int num_layers, int workers)
      : layers_(num_layers),
        workers_(workers),
        cells_(static_cast<size_t>(rows) * num_layers * workers) {}
  // m counts workers from 1.
  Cell& at(int i, int j, int m) {
    return cells_[(static_cast<size_t>(i) * layers_ + j) * workers_ + (m - 1)];
  }

 private:
  int layers_, workers_;
  std::vector<Cell> cells_;
};

// Follows PipeDream's optimizer_graph_hierarchical.py (see docs/PARTITIONING.md for where it
// differs from the paper's formula, and why we follow the code).
class PipeDreamPlanner {
 public:
  PipeDreamPlanner(const LayerSums& sums, const std::vector<Level>& levels, double memory_limit)
      : sums_(sums), levels_(levels), memory_limit_(memory_limit) {}

  Partition plan() {
    const int L = sums_.num_layers();
    for (size_t l = 0; l < levels_.size(); ++l) solve_level(static_cast<int>(l));
    const int top = static_cast<int>(levels_.size()) - 1;
    const int workers = levels_[top].workers;
    double time = tables_[top].at(0, L - 1, workers).time_s;
    PPTRAIN_CHECK(std::isfinite(time), "pipedream: no partition fits the memory limit of ",
                  memory_limit_, " bytes per worker");
    Partition out;
    out.method = "pipedream";
    expand(top, 0, L - 1, workers, 1, out.stages);
    out.time_per_minibatch_s = time;
    double single = sums_.compute_s(0, L - 1);
    out.speedup_vs_single = time > 0 ? single / time : 1;
    return out;
  }

 private:
  // The time of layers i..j as one unit of this level: their compute on level 0, the best
  // pipeline of the level below (on all its workers) above that.
  double unit_time(int level, int i, int j) {
    if (level == 0) return sums_.compute_s(i, j);
    return tables_[level - 1].at(i, j, levels_[level - 1].workers).time_s;
  }

  // PipeDream's memory check: a stage keeps its parameters and stashed activations once per
  // input in flight, which it counts as ceil(workers after this stage / replicas). That count
  // is 0 for the last stage and for plain data parallelism, so the limit would never bind
  // there; we count at least the one copy every worker holds.
  bool fits(int i, int j, int workers_after, int replicas) const {
    if (memory_limit_ <= 0) return true;
    double copies = std::max(1.0, std::ceil(static_cast<double>(workers_after) / replicas));
    return copies * (sums_.stash_bytes(i, j) + sums_.parameter_bytes(i, j)) <= memory_limit_;
  }

  // Data-parallel sync of a stage's weights over `replicas` workers, per input.
  static double sync_s(double parameter_bytes, int replicas, double bandwidth) {
    return 4.0 * (replicas - 1) * parameter_bytes / (bandwidth * replicas);
  }

  void solve_level(int level) {
    const int L = sums_.num_layers();
    const int N = levels_[level].workers;
    const double bw = levels_[level].bandwidth_bytes_per_s;
    const double within = level == 0 ? 1 : levels_[level - 1].workers;
    const bool top = level + 1 == static_cast<int>(levels_.size());
    // The top level needs only pipelines starting at layer 0; a lower level serves every range.
    const int rows = top ? 1 : L;
    tables_.emplace_back(rows, L, N);
    LevelTable& A = tables_.back();

    // One stage on m workers. PipeDream divides its sync time by the workers of the level below
    // here, and only here.
    for (int i = 0; i < rows; ++i) {
      for (int j = i; j < L; ++j) {
        double unit = unit_time(level, i, j);
        double params = sums_.parameter_bytes(i, j);
        for (int m = 1; m <= N; ++m) {
          if (!std::isfinite(unit) || !fits(i, j, N - m, m)) continue;
          A.at(i, j, m) = {(unit + sync_s(params, m, bw) / within) / m, -1, 0, m};
        }
      }
    }
    // A pipeline on m workers: a best pipeline over i..k on m - r workers, then k+1..j on r.
    for (int i = 0; i < rows; ++i) {
      for (int m = 2; m <= N; ++m) {
        for (int j = i + 1; j < L; ++j) {
          Cell best = A.at(i, j, m);
          const double out_bytes = j < L - 1 ? sums_.cut_bytes(j) : 0;
          for (int k = i; k < j; ++k) {
            double unit = unit_time(level, k + 1, j);
            if (!std::isfinite(unit)) continue;
            double params = sums_.parameter_bytes(k + 1, j);
            for (int r = 1; r < m; ++r) {
              double before = A.at(i, k, m - r).time_s;
              if (!std::isfinite(before) || !fits(k + 1, j, N - m, r)) continue;
              double last = (unit + sync_s(params, r, bw)) / r;
              double transfer = 2.0 * std::max(sums_.cut_bytes(k), out_bytes) / (bw * r);
              double t = std::max({before, last, transfer});
              if (t < best.time_s) best = {t, k, m - r, r};
            }
          }
          A.at(i, j, m) = best;
        }
      }
    }
  }

  // Appends the stages of the best pipeline over first..last on `workers` workers of `level`,
  // each replicated `copies` times by the levels above, expanding each into the level below.
  void expand(int level, int first, int last, int workers, int copies,
              std::vector<StagePlan>& stages) {
    std::vector<Cell> chain;  // last stage first
    std::vector<int> ends;
    for (int j = last, m = workers;;) {
      Cell c = tables_[level].at(first, j, m);
      PPTRAIN_ASSERT(std::isfinite(c.time_s));
      chain.push_back(c);
      ends.push_back(j);
      if (c.split < 0) break;
      j = c.split;
      m = c.rest;
    }
    for (size_t s = chain.size(); s-- > 0;) {
      int lo = chain[s].split < 0 ? first : chain[s].split + 1;
      int hi = ends[s];
      int replicas = copies * chain[s].replicas;
      if (level == 0) {
        stages.push_back({lo, hi, replicas, sums_.compute_s(lo, hi) / replicas});
      } else {
        expand(level - 1, lo, hi, levels_[level - 1].workers, replicas, stages);
      }
    }
  }

  const LayerSums& sums_;
  const std::vector<Level>& levels_;
  double memory_limit_;
  std::vector<LevelTable> tables_;  // one per level, innermost first
};

}  // namespace

double stage_time_s(const Profile& profile, int first_layer, int last_layer,
                    double bandwidth_bytes_per_s) {
  const int L = static_cast<int>(profile.layers.size());
  PPTRAIN_CHECK(0 <= first_layer && first_layer <= last_layer && last_layer < L, "stage layers ",
                first_layer, "..", last_layer, " are not a range of 0..", L - 1);
  LayerSums sums(profile);
  return time_cost(sums, first_layer, last_layer, bandwidth_bytes_per_s);
}

const std::vector<std::string>& partition_methods() {
  static const std::vector<std::string> methods = {"uniform", "params", "time", "pipedream"};
  return methods;
}

PartitionOptions partition_options(const PartitionRequest& request) {
  check_partition_method(request.method);
  PartitionOptions options;
  options.method = request.method;
  options.memory_limit_bytes = request.memory_limit;
  PPTRAIN_CHECK(request.memory_limit >= 0, "--memory-limit must be >= 0 bytes, got ",
                request.memory_limit);
  if (request.method == "pipedream") {
    PPTRAIN_CHECK(request.pp == 0,
                  "--pp does not apply to pipedream, which chooses the stages "
                  "itself; give --workers N and/or --levels");
    PPTRAIN_CHECK(request.bandwidth == 0,
                  "--bandwidth does not apply to pipedream; give the "
                  "bandwidth of each level with --levels N:BYTES_PER_S");
    PPTRAIN_CHECK(request.workers > 0 || !request.levels.empty(),
                  "pipedream needs --workers N or --levels N1:BW1,N2:BW2");
    if (request.levels.empty()) {
      options.levels = {{request.workers, kDefaultBandwidthBytesPerS}};
      return options;
    }
    options.levels = request.levels;
    long total = 1;
    std::ostringstream text;  // the levels as --levels writes them
    for (const Level& l : options.levels) {
      PPTRAIN_CHECK(l.workers >= 1 && l.workers <= 1 << 20 && l.bandwidth_bytes_per_s > 0,
                    "--levels: bad level ", l.workers, ":", l.bandwidth_bytes_per_s,
                    "; expected an integer >= 1 workers and bytes per second > 0");
      text << (total == 1 && text.tellp() == 0 ? "" : ",") << l.workers << ':'
           << l.bandwidth_bytes_per_s;
      total *= l.workers;
    }
    PPTRAIN_CHECK(request.workers == 0 || request.workers == total, "--workers ", request.workers,
                  " does not match --levels ", text.str(), ", which has ", total, " workers");
    return options;
  }
  PPTRAIN_CHECK(request.workers == 0 && request.levels.empty(),
                "--workers and --levels apply to "
                "pipedream only; method ",
                request.method, " takes the number of stages with --pp P");
  PPTRAIN_CHECK(request.pp > 0, "method ", request.method,
                " needs --pp P (the number of stages), got ", request.pp);
  PPTRAIN_CHECK(request.bandwidth >= 0, "--bandwidth must be >= 0 bytes/s, got ",
                request.bandwidth);
  options.stages = request.pp;
  options.bandwidth_bytes_per_s = request.bandwidth;
  if (!request.workers_profile.empty()) {
    PPTRAIN_CHECK(request.method == "time", "--workers-profile applies to method time, not ",
                  request.method);
    const WorkersProfile workers = read_workers_profile(request.workers_profile);
    check_workers_count(workers, request.pp,
                        detail::concat("--pp ", request.pp, " (stage p on rank p)"));
    options.stage_speeds = workers.speeds();
  }
  return options;
}

void check_partition_method(const std::string& method) {
  const auto& methods = partition_methods();
  if (std::find(methods.begin(), methods.end(), method) != methods.end()) return;
  std::string expected;
  for (const std::string& m : methods) expected += (expected.empty() ? "" : ", ") + m;
  throw UserError(
      detail::concat("unknown partition method '", method, "'; expected one of ", expected));
}

Partition make_partition(const Profile& profile, const PartitionOptions& options) {
  const int L = static_cast<int>(profile.layers.size());
  PPTRAIN_CHECK(L > 0, profile.source, ": the profile has no layers");
  PPTRAIN_CHECK(L <= kMaxProfileLayers, profile.source, ": ", L, " layers, more than the ",
                kMaxProfileLayers, " the partitioners take");
  LayerSums sums(profile);
  const std::string& method = options.method;
  check_partition_method(method);

  if (method == "pipedream") {
    PPTRAIN_CHECK(!options.levels.empty(),
                  "pipedream needs the machine: at least one level of workers and bandwidth");
    for (const Level& level : options.levels) {
      PPTRAIN_CHECK(level.workers >= 1, "a level needs >= 1 workers, got ", level.workers);
      PPTRAIN_CHECK(level.bandwidth_bytes_per_s > 0, "a level needs a bandwidth > 0 bytes/s, got ",
                    level.bandwidth_bytes_per_s);
    }
    long long workers = 1;
    for (const Level& level : options.levels) {
      workers *= level.workers;
      PPTRAIN_CHECK(workers <= kMaxPartitionWorkers, "pipedream: more than ", kMaxPartitionWorkers,
                    " workers (the levels multiply to ", workers,
                    " so far); the partitioner takes at most that many");
    }
    PPTRAIN_CHECK(workers * L <= kMaxPipeDreamLayerWorkers, "pipedream: ", L, " layers x ", workers,
                  " workers is more than the ", kMaxPipeDreamLayerWorkers,
                  " its dynamic program plans in seconds");
    PPTRAIN_CHECK(options.memory_limit_bytes >= 0, "memory limit must be >= 0 bytes, got ",
                  options.memory_limit_bytes);
    return PipeDreamPlanner(sums, options.levels, options.memory_limit_bytes).plan();
  }

  const int P = options.stages;
  PPTRAIN_CHECK(P >= 1, method, " needs a number of stages >= 1, got ", P);
  PPTRAIN_CHECK(P <= kMaxPartitionWorkers, method, ": ", P, " stages, more than the ",
                kMaxPartitionWorkers, " the partitioners take");
  PPTRAIN_CHECK(P <= L, "cannot cut ", L, " layers into ", P,
                " stages: each stage needs at least one layer");
  PPTRAIN_CHECK(options.memory_limit_bytes == 0,
                "a memory limit is supported by the pipedream method only, not by ", method);
  const std::vector<double>& speeds = options.stage_speeds;
  PPTRAIN_CHECK(speeds.empty() || method == "time", "worker speeds apply to the time method only, ",
                "not to ", method);
  PPTRAIN_CHECK(speeds.empty() || static_cast<int>(speeds.size()) == P, "time: ", speeds.size(),
                " stage speeds for ", P, " stages");
  for (size_t p = 0; p < speeds.size(); ++p) {
    PPTRAIN_CHECK(std::isfinite(speeds[p]) && speeds[p] > 0, "time: stage ", p, " has speed ",
                  speeds[p], "; expected > 0");
  }
  auto speed = [&](int p) { return speeds.empty() ? 1.0 : speeds[p]; };
  const double bw = options.bandwidth_bytes_per_s;
  PPTRAIN_CHECK(bw >= 0, "bandwidth must be >= 0 bytes/s (0 = compute only), got ", bw);

  std::vector<int> firsts;
  if (method == "uniform") {
    for (int s = 0, first = 0; s < P; ++s) {
      firsts.push_back(first);
      first += L / P + (s < L % P ? 1 : 0);
    }
  } else if (method == "params") {
    auto params = [&](int, int i, int j) { return sums.parameter_bytes(i, j); };
    firsts = min_max_split(L, P, params, params);
  } else {
    // A stage on a worker of speed s computes 1/s as fast; its transfers stay as they are.
    firsts = min_max_split(
        L, P, [&](int p, int i, int j) { return time_cost(sums, i, j, bw, speed(p)); },
        [&](int p, int i, int j) { return sums.compute_s(i, j) / speed(p); });
  }
  return unreplicated_partition(method, sums, firsts, bw, options.stage_speeds);
}

std::string to_json(const Partition& partition) {
  nlohmann::ordered_json doc;
  doc["method"] = partition.method;
  doc["stages"] = nlohmann::ordered_json::array();
  for (const StagePlan& s : partition.stages) {
    doc["stages"].push_back({{"first_layer", s.first_layer},
                             {"last_layer", s.last_layer},
                             {"replicas", s.replicas},
                             {"compute_s", s.compute_s}});
  }
  doc["time_per_minibatch_s"] = partition.time_per_minibatch_s;
  doc["speedup_vs_single"] = partition.speedup_vs_single;
  return doc.dump(2);
}

Partition parse_partition_json(const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // bad syntax, or a number out of range
    throw UserError(detail::concat("partition: not valid JSON: ", e.what()));
  }
  PPTRAIN_CHECK(doc.is_object() && doc.contains("stages") && doc["stages"].is_array(),
                "partition: expected an object with a 'stages' array");
  auto number = [](const nlohmann::json& obj, const char* key, double fallback,
                   const std::string& where) {
    if (!obj.contains(key)) return fallback;
    PPTRAIN_CHECK(obj[key].is_number(), where, ": '", key, "' must be a number, got ",
                  obj[key].dump());
    return obj[key].get<double>();
  };
  auto integer = [](const nlohmann::json& obj, const char* key, const std::string& where) {
    PPTRAIN_CHECK(obj.contains(key), where, ": missing field '", key, "'");
    PPTRAIN_CHECK(obj[key].is_number_integer(), where, ": '", key, "' must be an integer, got ",
                  obj[key].dump());
    // Layer indices and replica counts: far below int's range, so that arithmetic on them
    // (last_layer + 1) cannot overflow.
    constexpr int64_t kLargest = 1 << 24;
    const auto value = obj[key].get<int64_t>();
    PPTRAIN_CHECK(value >= 0 && value <= kLargest, where, ": '", key, "' must be in 0..", kLargest,
                  ", got ", value);
    return static_cast<int>(value);
  };

  Partition p;
  p.method = doc.value("method", std::string("file"));
  p.time_per_minibatch_s = number(doc, "time_per_minibatch_s", 0, "partition");
  p.speedup_vs_single = number(doc, "speedup_vs_single", 1, "partition");
  const nlohmann::json& stages = doc["stages"];
  PPTRAIN_CHECK(!stages.empty(), "partition: 'stages' is empty");
  for (size_t s = 0; s < stages.size(); ++s) {
    std::string where = detail::concat("partition: stage ", s);
    PPTRAIN_CHECK(stages[s].is_object(), where, ": expected an object, got ", stages[s].dump());
    StagePlan plan;
    plan.first_layer = integer(stages[s], "first_layer", where);
    plan.last_layer = integer(stages[s], "last_layer", where);
    plan.replicas = stages[s].contains("replicas") ? integer(stages[s], "replicas", where) : 1;
    plan.compute_s = number(stages[s], "compute_s", 0, where);
    PPTRAIN_CHECK(plan.replicas >= 1, where, ": replicas must be >= 1, got ", plan.replicas);
    PPTRAIN_CHECK(plan.first_layer <= plan.last_layer, where, ": first_layer ", plan.first_layer,
                  " is after last_layer ", plan.last_layer);
    int expected_first = s == 0 ? 0 : p.stages.back().last_layer + 1;
    PPTRAIN_CHECK(plan.first_layer == expected_first, where, ": first_layer must be ",
                  expected_first, " (stages are contiguous from layer 0), got ", plan.first_layer);
    p.stages.push_back(plan);
  }
  return p;
}

void check_partition(const Partition& partition, int num_layers) {
  PPTRAIN_CHECK(!partition.stages.empty(), "partition '", partition.method, "' has no stages");
  int next = 0;
  for (size_t s = 0; s < partition.stages.size(); ++s) {
    const StagePlan& plan = partition.stages[s];
    PPTRAIN_CHECK(plan.first_layer == next && plan.first_layer <= plan.last_layer, "partition '",
                  partition.method, "': stage ", s, " covers layers ", plan.first_layer, "..",
                  plan.last_layer, ", expected a range starting at layer ", next);
    next = plan.last_layer + 1;
  }
  PPTRAIN_CHECK(next == num_layers, "partition '", partition.method, "' covers layers 0..",
                next - 1, " but the model has ", num_layers, " layers (0..", num_layers - 1, ")");
}

std::string format_stage_layers(const std::vector<LayerRange>& ranges) {
  std::string text;
  for (const auto& [first, last] : ranges) {
    text += (text.empty() ? "" : ",") + std::to_string(first) + "-" + std::to_string(last);
  }
  return text;
}

std::vector<LayerRange> parse_stage_layers(const std::string& text) {
  std::vector<LayerRange> ranges;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t dash = item.find('-');
    const std::string first = item.substr(0, dash);
    const std::string last = dash == std::string::npos ? "" : item.substr(dash + 1);
    const bool digits = !first.empty() && !last.empty() &&
                        first.find_first_not_of("0123456789") == std::string::npos &&
                        last.find_first_not_of("0123456789") == std::string::npos &&
                        first.size() < 9 && last.size() < 9;
    PPTRAIN_CHECK(digits, "--stage-layers '", text, "': bad range '", item,
                  "', expected FIRST-LAST layer indices separated by commas, e.g. 0-2,3-5");
    ranges.emplace_back(std::atoi(first.c_str()), std::atoi(last.c_str()));
  }
  PPTRAIN_CHECK(!ranges.empty() && text.back() != ',', "--stage-layers '", text,
                "': expected FIRST-LAST layer indices separated by commas, e.g. 0-2,3-5");
  return ranges;
}

}  // namespace pptrain
