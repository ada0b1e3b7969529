#include "pptrain/planner/worker_cut.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

constexpr double kLimitSlack = 1e-9;  // as the planner's: sums in another order differ in bits

// C(n, k), or `most` + 1 once it passes `most`.
long long choose_capped(int n, int k, long long most) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  long long out = 1;
  for (int i = 1; i <= k; ++i) {
    out = out * (n - k + i) / i;  // exact: a product of i consecutive numbers divides by i!
    if (out > most) return most + 1;
  }
  return out;
}

// The cuts tried after the time cut when there are too many to try all: the planner's methods'.
std::vector<std::vector<LayerRange>> method_cuts(const WorkerCutRequest& request) {
  std::vector<std::vector<LayerRange>> out;
  const int stages = static_cast<int>(request.time_cut.size());
  for (const char* method : {"uniform", "params", "time"}) {
    PartitionOptions options;
    options.method = method;
    options.stages = stages;
    if (options.method == "time") options.stage_speeds = request.stage_speeds;
    std::vector<LayerRange> cut;
    for (const StagePlan& stage : make_partition(request.profile, options).stages) {
      cut.emplace_back(stage.first_layer, stage.last_layer);
    }
    out.push_back(std::move(cut));
  }
  return out;
}

// The limit rank r's plans are made under (its limit less the margin); 0: none.
double planning_limit(const PlannerOptions& options, int r) {
  return rank_memory_limit(options, r) * (1 - options.memory_margin);
}

bool fits_rank(const PlannerOptions& options, const std::vector<double>& peaks, int r) {
  const double limit = planning_limit(options, r);
  return limit <= 0 || peaks[r] <= limit * (1 + kLimitSlack);
}

// The smallest limit that works on a rank: its peak plus the margin.
std::string needed(const PlannerOptions& options, double peak) {
  const double bytes = peak / (1 - options.memory_margin);
  return detail::concat(megabytes(bytes), " (", static_cast<long long>(std::ceil(bytes)),
                        " bytes)");
}

// The UserError when no cut fits (header).
UserError no_cut_fits(const WorkerCutRequest& request,
                      const std::vector<std::vector<LayerRange>>& cuts,
                      const std::vector<std::vector<double>>& peaks) {
  const PlannerOptions& options = request.planner;
  const int P = options.workers;
  const std::string head = detail::concat(request.what, request.what.empty() ? "" : ": ",
                                          "no cut of the model's ", request.profile.layers.size(),
                                          " layers into ", request.time_cut.size(), " stages fits");
  // One rank whose limit alone is too small: the smallest peak it has in a cut the others fit.
  int rank = -1;
  double rank_need = 0;
  size_t rank_cut = 0;
  for (int r = 0; r < P; ++r) {
    if (rank_memory_limit(options, r) <= 0) continue;
    for (size_t i = 0; i < cuts.size(); ++i) {
      bool others = true;
      for (int q = 0; q < P && others; ++q) others = q == r || fits_rank(options, peaks[i], q);
      if (!others) continue;
      const double raise = peaks[i][r] - planning_limit(options, r);
      if (rank < 0 || raise < rank_need - planning_limit(options, rank)) {
        rank = r;
        rank_need = peaks[i][r];
        rank_cut = i;
      }
    }
  }
  const std::string margin =
      detail::concat(" less its margin of ", options.memory_margin * 100, "%");
  if (rank >= 0) {
    return UserError(detail::concat(
        head, " rank ", rank, "'s memory limit of ", megabytes(rank_memory_limit(options, rank)),
        margin, "; the smallest limit that works on rank ", rank, " is ",
        needed(options, rank_need), ", with the other ranks' limits as they are (stage layers ",
        format_stage_layers(cuts[rank_cut]), ")"));
  }
  // Several ranks too small: the cut least over any rank's limit, and each rank over there.
  size_t closest = 0;
  double least = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < cuts.size(); ++i) {
    double over = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < P; ++r) {
      if (planning_limit(options, r) > 0)
        over = std::max(over, peaks[i][r] - planning_limit(options, r));
    }
    if (over < least) {
      least = over;
      closest = i;
    }
  }
  std::string ranks;
  for (int r = 0; r < P; ++r) {
    if (fits_rank(options, peaks[closest], r)) continue;
    ranks += detail::concat(ranks.empty() ? "" : ", ", "rank ", r, " ",
                            needed(options, peaks[closest][r]), " (its limit ",
                            megabytes(rank_memory_limit(options, r)), ")");
  }
  return UserError(detail::concat(head, " the ranks' memory limits less the margin of ",
                                  options.memory_margin * 100, "%", "; the closest, stage layers ",
                                  format_stage_layers(cuts[closest]), ", needs at least ", ranks));
}

}  // namespace

double slowest_stage_ms(const Profile& profile, const std::vector<LayerRange>& cut,
                        const std::vector<double>& stage_speeds) {
  PPTRAIN_ASSERT(cut.size() == stage_speeds.size());
  double slowest = 0;
  for (size_t s = 0; s < cut.size(); ++s) {
    double ms = 0;
    for (int l = cut[s].first; l <= cut[s].second; ++l) ms += profile.layers[l].compute_ms();
    slowest = std::max(slowest, ms / stage_speeds[s]);
  }
  return slowest;
}

std::vector<std::vector<LayerRange>> every_cut(int layers, int stages, long long most) {
  std::vector<std::vector<LayerRange>> out;
  if (stages < 1 || choose_capped(layers - 1, stages - 1, most) > most) return out;
  std::vector<LayerRange> cut;
  // Stage s starts at `first`; each stage leaves at least a layer to every later one.
  const auto extend = [&](const auto& self, int first, int s) -> void {
    if (s == stages - 1) {
      cut.emplace_back(first, layers - 1);
      out.push_back(cut);
      cut.pop_back();
      return;
    }
    for (int last = first; last <= layers - (stages - s); ++last) {
      cut.emplace_back(first, last);
      self(self, last + 1, s + 1);
      cut.pop_back();
    }
  };
  extend(extend, 0, 0);
  return out;
}

WorkerCut fit_cut_to_workers(const WorkerCutRequest& request) {
  const PlannerOptions& options = request.planner;
  const int stages = static_cast<int>(request.time_cut.size());
  const int layers = static_cast<int>(request.profile.layers.size());
  PPTRAIN_ASSERT(static_cast<int>(request.stage_speeds.size()) == stages);
  WorkerCut out;
  const auto peaks_of = [&](const std::vector<std::vector<LayerRange>>& cuts) {
    out.cuts_tried += static_cast<int>(cuts.size());
    return cut_peak_bytes(request.profile, options, request.shape, cuts, request.gradient_buffers);
  };
  const auto chosen = [&](const std::vector<LayerRange>& cut, std::vector<double> peaks) {
    out.stage_layers = cut;
    out.peak_bytes = std::move(peaks);
    out.slowest_stage_ms = slowest_stage_ms(request.profile, cut, request.stage_speeds);
    return out;
  };
  std::vector<double> first = peaks_of({request.time_cut}).front();
  if (fits_memory_limits(options, first)) return chosen(request.time_cut, std::move(first));

  std::vector<std::vector<LayerRange>> cuts = every_cut(layers, stages, kMaxWorkerCuts);
  if (cuts.empty()) cuts = method_cuts(request);
  std::vector<double> slowest;
  for (const auto& cut : cuts) {
    slowest.push_back(slowest_stage_ms(request.profile, cut, request.stage_speeds));
  }
  std::vector<size_t> order(cuts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return slowest[a] < slowest[b]; });
  std::vector<std::vector<LayerRange>> ordered;
  for (size_t i : order) ordered.push_back(cuts[i]);
  const std::vector<std::vector<double>> peaks = peaks_of(ordered);
  for (size_t i = 0; i < ordered.size(); ++i) {
    if (fits_memory_limits(options, peaks[i])) return chosen(ordered[i], peaks[i]);
  }
  throw no_cut_fits(request, ordered, peaks);
}

}  // namespace pptrain
