#include "pptrain/generators/auto_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"

namespace pptrain {
namespace {

constexpr double kEps = 1e-9;  // times and memory compare with this slack

// Whether `memory` is within `limit`, with a slack relative to the limit: the planner's limits
// are bytes (1e9 and more), whose sums in another order differ in the last bits.
bool fits(double memory, double limit) {
  return memory <= limit + kEps * std::max(1.0, limit);
}

// The order zb-auto ranks its candidates in: the step's end first (the step time), then the
// longest rank span (the paper's objective: with equal ends, the less idle schedule).
bool faster(const ScheduleTiming& a, const ScheduleTiming& b) {
  if (std::abs(a.makespan - b.makespan) > kEps * std::max(1.0, b.makespan)) {
    return a.makespan < b.makespan;
  }
  return a.span < b.span - kEps;
}

struct Flags {
  bool bubble_before_first_i = false;
  bool prioritize_i = false;
  bool fill_small_gaps = false;
  // Warm-up F's of stage j at most: 0 as many as fit, 1 1F1B's P - j, 2 ZB-H2's 2(P - j) - 1.
  int warm_up_shape = 0;
};
constexpr int kWarmUpShapes = 3;

// One candidate of the greedy (see the header for the rules). run() returns the schedule and
// its longest rank span, or nothing when a needed F cannot fit the limit.
class Greedy {
 public:
  Greedy(int ranks, int microbatches, const StageCosts& costs, const std::vector<double>& limits,
         Flags flags)
      : P_(ranks), M_(microbatches), c_(costs), limits_(limits), flags_(flags), stages_(ranks) {
    for (Stage& s : stages_) {
      s.f_end.assign(M_, 0.0);
      s.i_end.assign(M_, 0.0);
    }
  }

  // The warm-up (below); false when a needed F cannot fit the limit. Everything after it depends
  // on the flags only through fill_small_gaps and prioritize_i, and on what it placed only
  // through warm_up_counts(): two candidates equal in those three make the same schedule.
  bool warm_up() {
    for (int j = 0; j < P_; ++j) {
      if (!forward(j)) return false;
    }
    warm_up_ = planned_warm_up();
    for (int j = 0; j < P_; ++j) {
      while (stages_[j].nf < warm_up_[j]) {
        if (!forward(j)) return false;
      }
    }
    for (int j = P_ - 1; j >= 0; --j) place(j, Op::I, i_ready(j, 0));
    return true;
  }
  // [stage] the F's it ran in the warm-up, before microbatch 0's I.
  const std::vector<int>& warm_up_counts() const { return warm_up_; }

  // The rest, after a warm-up that succeeded: the schedule and its timing, or nothing when a
  // needed F cannot fit the limit, or when its makespan would come out above `beaten` (then it
  // could not be faster() than a schedule of that makespan: it stops as soon as that is sure).
  std::optional<std::pair<Schedule, ScheduleTiming>> finish(
      double beaten = std::numeric_limits<double>::infinity()) {
    // A makespan above this is not within faster()'s tolerance of `beaten`; the margin covers
    // the rounding of least_makespan()'s sums, orders of magnitude below the tolerance.
    const double cut = beaten + 2 * kEps * std::max(1.0, beaten);
    for (int i = 1; i < M_; ++i) {
      if (!round(i)) return std::nullopt;
      if (least_makespan() > cut) return std::nullopt;
    }
    ScheduleTiming timing;
    for (int j = 0; j < P_; ++j) {
      while (stages_[j].nw < M_) place(j, Op::W, 0);
      timing.span = std::max(timing.span, stages_[j].end - stages_[j].first_start);
      timing.makespan = std::max(timing.makespan, stages_[j].end);
    }
    Schedule s;
    s.name = "zb-auto";
    s.num_ranks = P_;
    s.num_stages = P_;
    s.num_microbatches = M_;
    for (int j = 0; j < P_; ++j) {
      s.stage_to_rank.push_back(j);
      s.actions.push_back(std::move(stages_[j].order));
    }
    return std::make_pair(std::move(s), timing);
  }

 private:
  struct Stage {
    std::vector<Action> order;
    double first_start = -1;  // start of its first action; -1 before it has one
    double end = 0;           // end of its last action
    double memory = 0;        // held now, memory-model units
    double idle = 0;          // waits between its first start and `end`
    int nf = 0, ni = 0, nw = 0;
    std::vector<double> f_end, i_end;  // [microbatch]
    bool deferred_f = false;           // prioritize_i: this round's F waits for the I phase
  };

  // No less than the makespan this candidate will have: each stage's actions left run one after
  // another, after its last placed one.
  double least_makespan() const {
    double least = 0;
    for (int j = 0; j < P_; ++j) {
      const Stage& s = stages_[j];
      least =
          std::max(least, s.end + (M_ - s.nf) * c_.forward[j] + (M_ - s.ni) * c_.backward_input[j] +
                              (M_ - s.nw) * c_.backward_weight[j]);
    }
    return least;
  }

  double time(Op op, int j) const {
    if (op == Op::F) return c_.forward[j];
    return op == Op::I ? c_.backward_input[j] : c_.backward_weight[j];
  }

  // Appends the stage's next `op` (microbatch in order), starting at `ready` or when free.
  void place(int j, Op op, double ready) {
    Stage& s = stages_[j];
    const double start = s.first_start < 0 ? ready : std::max(s.end, ready);
    if (s.first_start < 0) {
      s.first_start = start;
    } else {
      s.idle += start - s.end;
      most_idle_ = std::max(most_idle_, s.idle);
    }
    s.end = start + time(op, j);
    int& count = op == Op::F ? s.nf : op == Op::I ? s.ni : s.nw;
    s.order.emplace_back(op, j, count);
    if (op == Op::F) {
      s.f_end[count] = s.end;
      s.memory += c_.activation[j];
    } else if (op == Op::I) {
      s.i_end[count] = s.end;
      s.memory -= c_.activation[j] - c_.weight_stash[j];
    } else {
      s.memory -= c_.weight_stash[j];
    }
    ++count;
  }

  // Pending W's that fit before `ready`; then one more in a shorter gap if the rule says so.
  void fill_gap(int j, double ready) {
    Stage& s = stages_[j];
    while (s.nw < s.ni && s.end + c_.backward_weight[j] <= ready + kEps) place(j, Op::W, 0);
    if (s.nw == s.ni || s.end >= ready - kEps) return;
    if (flags_.fill_small_gaps || s.idle + (ready - s.end) > most_idle_ + kEps) {
      place(j, Op::W, 0);
    }
  }

  // Runs pending W's until one more F fits the limit; false if it cannot.
  bool make_room(int j) {
    Stage& s = stages_[j];
    while (!fits(s.memory + c_.activation[j], limits_[j]) && s.nw < s.ni) place(j, Op::W, 0);
    return fits(s.memory + c_.activation[j], limits_[j]);
  }

  double f_ready(int j, int microbatch) const {
    return j == 0 ? 0 : stages_[j - 1].f_end[microbatch] + c_.comm;
  }

  double i_ready(int j, int microbatch) const {
    const double own = stages_[j].f_end[microbatch];
    if (j == P_ - 1) return own;
    return std::max(own, stages_[j + 1].i_end[microbatch] + c_.comm);
  }

  // The stage's next F, after W's that fill the wait for its input or make room for it.
  bool forward(int j) {
    fill_gap(j, f_ready(j, stages_[j].nf));
    if (!make_room(j)) return false;
    place(j, Op::F, f_ready(j, stages_[j].nf));
    return true;
  }

  // How many F's each stage runs before microbatch 0's gradient reaches it, last stage first:
  // those that fit (in time and memory) while the gradient comes back; after each stage's first
  // F (warm_up() placed them).
  std::vector<int> planned_warm_up() const {
    std::vector<int> count(P_, 1);
    double gradient_end = stages_[P_ - 1].end + c_.backward_input[P_ - 1];
    for (int j = P_ - 2; j >= 0; --j) {
      const double arrives = gradient_end + c_.comm;
      double t = stages_[j].end, memory = c_.activation[j];
      const int shape_cap = flags_.warm_up_shape == 0   ? M_
                            : flags_.warm_up_shape == 1 ? P_ - j
                                                        : 2 * (P_ - j) - 1;
      while (count[j] < std::min(M_, shape_cap) && fits(memory + c_.activation[j], limits_[j]) &&
             (flags_.bubble_before_first_i ? t < arrives - kEps
                                           : t + c_.forward[j] <= arrives + kEps)) {
        t += c_.forward[j];
        memory += c_.activation[j];
        ++count[j];
      }
      gradient_end = std::max(t, arrives) + c_.backward_input[j];
    }
    // A stage can only run F's its predecessor has run, and keeps one fewer in flight: its
    // round's F then finds its input computed (an equal count would wait for the predecessor's
    // round, which comes after that stage's I). Equal counts only where the predecessor runs
    // every F in its warm-up (M < P), or where the limit leaves no room.
    for (int j = 1; j < P_; ++j) {
      const int most = count[j - 1] == M_ ? M_ : count[j - 1] - 1;
      count[j] = std::max(1, std::min(count[j], most));
    }
    return count;
  }

  // Round i: one more F per stage (first stage first), then microbatch i's I (last stage first).
  bool round(int i) {
    for (int j = 0; j < P_; ++j) {
      Stage& s = stages_[j];
      if (s.nf >= M_ || s.nf >= warm_up_[j] + i) continue;
      if (j > 0 && stages_[j - 1].nf <= s.nf) continue;  // its input is not computed yet
      const bool needed = s.nf <= i;                     // microbatch i's own F
      if (flags_.prioritize_i && !needed && j + 1 < P_ && s.nf >= stages_[j + 1].nf + 2) {
        s.deferred_f = true;
        continue;
      }
      if (!forward(j) && needed) return false;
    }
    for (int j = P_ - 1; j >= 0; --j) {
      Stage& s = stages_[j];
      // The F phase ran every stage's F of microbatch i (or gave up).
      PPTRAIN_ASSERT(s.nf > i, "zb-auto: stage ", j, " reached microbatch ", i,
                     "'s I without its F");
      const double ready = i_ready(j, i);
      if (s.deferred_f && std::max(s.end, f_ready(j, s.nf)) + c_.forward[j] <= ready + kEps &&
          fits(s.memory + c_.activation[j], limits_[j])) {
        place(j, Op::F, f_ready(j, s.nf));  // fits in the wait for the gradient
        s.deferred_f = false;
      }
      fill_gap(j, ready);
      place(j, Op::I, ready);
      if (s.deferred_f) {
        s.deferred_f = false;
        if (make_room(j)) place(j, Op::F, f_ready(j, s.nf));
      }
    }
    return true;
  }

  const int P_, M_;
  const StageCosts& c_;
  const std::vector<double>& limits_;  // [stage] its rank's cap, infinity for none
  const Flags flags_;
  std::vector<Stage> stages_;
  std::vector<int> warm_up_;  // [stage] F's run before microbatch 0's I
  double most_idle_ = 0;      // the largest idle time of any stage so far
};

void check_costs(const StageCosts& c, int stages) {
  const std::pair<const char*, const std::vector<double>*> vectors[] = {
      {"forward", &c.forward},
      {"backward_input", &c.backward_input},
      {"backward_weight", &c.backward_weight},
      {"activation", &c.activation},
      {"weight_stash", &c.weight_stash},
  };
  for (const auto& [what, values] : vectors) {
    PPTRAIN_CHECK(static_cast<int>(values->size()) == stages, "zb-auto: ", what, " costs have ",
                  values->size(), " entries but the schedule has ", stages, " stages");
    for (int s = 0; s < stages; ++s) {
      PPTRAIN_CHECK(std::isfinite((*values)[s]) && (*values)[s] >= 0, "zb-auto: ", what, "[", s,
                    "] must be a finite number >= 0, got ", (*values)[s]);
    }
  }
  for (int s = 0; s < stages; ++s) {
    PPTRAIN_CHECK(c.weight_stash[s] <= c.activation[s] + kEps, "zb-auto: weight_stash[", s, "] ",
                  c.weight_stash[s], " is more than the activation ", c.activation[s],
                  " it is part of");
  }
  PPTRAIN_CHECK(std::isfinite(c.comm) && c.comm >= 0, "zb-auto: comm must be >= 0, got ", c.comm);
}

}  // namespace

StageCosts StageCosts::uniform(int stages, double forward, double backward_input,
                               double backward_weight, double comm, double mem_w_ratio) {
  StageCosts c;
  c.forward.assign(stages, forward);
  c.backward_input.assign(stages, backward_input);
  c.backward_weight.assign(stages, backward_weight);
  c.activation.assign(stages, 1.0);
  c.weight_stash.assign(stages, mem_w_ratio);
  c.comm = comm;
  return c;
}

double smallest_memory_limit(const StageCosts& costs) {
  double most = 0;
  for (double a : costs.activation) most = std::max(most, a);
  return most;
}

void check_feasible_memory_limit(const StageCosts& costs, double limit) {
  PPTRAIN_CHECK(std::isfinite(limit) && limit >= 0,
                "--memory-limit must be a finite number >= 0 (0: none), got ", limit);
  const double smallest = smallest_memory_limit(costs);
  PPTRAIN_CHECK(limit == 0 || limit >= smallest - kEps, "--memory-limit ", limit,
                " is below what any schedule needs: the smallest limit that works is ", smallest,
                " (one microbatch's forward activations on a stage)");
}

void check_feasible_memory_limits(const StageCosts& costs, const std::vector<double>& limits) {
  PPTRAIN_CHECK(static_cast<int>(limits.size()) == costs.stages(), "zb-auto: ", limits.size(),
                " memory limits for ", costs.stages(), " ranks (one per rank)");
  for (int r = 0; r < costs.stages(); ++r) {
    PPTRAIN_CHECK(std::isfinite(limits[r]) && limits[r] >= 0, "zb-auto: rank ", r,
                  "'s memory limit must be a finite number >= 0 (0: none), got ", limits[r]);
    PPTRAIN_CHECK(limits[r] == 0 || fits(costs.activation[r], limits[r]), "zb-auto: rank ", r,
                  "'s memory limit ", limits[r],
                  " is below what one microbatch needs there: the smallest limit that works on "
                  "rank ",
                  r, " is ", costs.activation[r], " (its stage's forward activations)");
  }
}

std::vector<double> resolved_memory_limits(const AutoScheduleOptions& o) {
  return o.rank_memory_limits.empty() ? std::vector<double>(o.ranks, o.memory_limit)
                                      : o.rank_memory_limits;
}

std::vector<double> peaks_in_order(const Schedule& schedule, const StageCosts& c) {
  std::vector<double> peaks;
  for (const auto& list : schedule.actions) {
    double held = 0, peak = 0;
    for (const Action& a : list) {
      if (a.op == Op::F) held += c.activation[a.stage];
      if (a.op == Op::I) held -= c.activation[a.stage] - c.weight_stash[a.stage];
      if (a.op == Op::W) held -= c.weight_stash[a.stage];
      peak = std::max(peak, held);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

double peak_in_order(const Schedule& schedule, const StageCosts& c) {
  const std::vector<double> peaks = peaks_in_order(schedule, c);
  return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end());
}

bool within_limits(const Schedule& schedule, const StageCosts& costs,
                   const std::vector<double>& limits) {
  const std::vector<double> peaks = peaks_in_order(schedule, costs);
  for (size_t r = 0; r < peaks.size(); ++r) {
    if (limits[r] > 0 && !fits(peaks[r], limits[r])) return false;
  }
  return true;
}

std::optional<ScheduleTiming> timed_in_order(const Schedule& s, const StageCosts& c) {
  const int P = s.num_ranks, M = s.num_microbatches;
  constexpr double kNotYet = -1;
  const auto index = [](Op op) { return op == Op::F ? 0 : op == Op::I ? 1 : 2; };
  const auto duration = [&](Op op, int stage) {
    return op == Op::F   ? c.forward[stage]
           : op == Op::I ? c.backward_input[stage]
                         : c.backward_weight[stage];
  };
  // end[op][stage][microbatch]
  std::vector<std::vector<std::vector<double>>> end(
      3, std::vector<std::vector<double>>(P, std::vector<double>(M, kNotYet)));
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0), first_start(P, 0.0);
  // When `a`'s inputs have all arrived; nothing while one has not run yet.
  const auto ready = [&](const Action& a) -> std::optional<double> {
    double at = 0;
    const auto input = [&](Op op, int stage, double delay) {
      const double e = end[index(op)][stage][a.microbatch];
      at = std::max(at, e + delay);
      return e != kNotYet;
    };
    if (a.op == Op::F && a.stage > 0 && !input(Op::F, a.stage - 1, c.comm)) return std::nullopt;
    if (a.op == Op::I && !input(Op::F, a.stage, 0)) return std::nullopt;
    if (a.op == Op::I && a.stage + 1 < P && !input(Op::I, a.stage + 1, c.comm)) {
      return std::nullopt;
    }
    if (a.op == Op::W && !input(Op::I, a.stage, 0)) return std::nullopt;
    return at;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][next[r]];
        const std::optional<double> at = ready(a);
        if (!at) break;
        const double start = next[r] == 0 ? *at : std::max(*at, free_at[r]);
        if (next[r] == 0) first_start[r] = start;
        free_at[r] = start + duration(a.op, a.stage);
        end[index(a.op)][a.stage][a.microbatch] = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  ScheduleTiming timing;
  for (int r = 0; r < P; ++r) {
    if (next[r] < s.actions[r].size()) return std::nullopt;  // deadlock
    timing.span = std::max(timing.span, free_at[r] - first_start[r]);
    timing.makespan = std::max(timing.makespan, free_at[r]);
  }
  return timing;
}

Schedule make_zb_auto(const AutoScheduleOptions& o, double* predicted_cost) {
  PPTRAIN_CHECK(o.ranks >= 1, "schedule 'zb-auto': ranks must be >= 1, got ", o.ranks);
  PPTRAIN_CHECK(o.microbatches >= 1, "schedule 'zb-auto': microbatches must be >= 1, got ",
                o.microbatches);
  const StageCosts costs = o.costs.stages() == 0 ? StageCosts::uniform(o.ranks) : o.costs;
  check_costs(costs, o.ranks);
  check_feasible_memory_limit(costs, o.memory_limit);
  const std::vector<double> given = resolved_memory_limits(o);
  check_feasible_memory_limits(costs, given);
  std::vector<double> limits = given;
  for (double& limit : limits) {
    if (limit == 0) limit = std::numeric_limits<double>::infinity();
  }
  std::optional<std::pair<Schedule, ScheduleTiming>> best;
  const auto keep = [&](std::optional<std::pair<Schedule, ScheduleTiming>> candidate) {
    if (candidate && (!best || faster(candidate->second, best->second)))
      best = std::move(candidate);
  };
  // A candidate equal to an earlier one in what its schedule depends on (Greedy::warm_up) would
  // make that schedule again: it is not run past its warm-up.
  std::set<std::tuple<bool, bool, std::vector<int>>> made;
  for (int bits = 0; bits < 8 * kWarmUpShapes; ++bits) {
    const Flags flags{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, bits / 8};
    Greedy greedy(o.ranks, o.microbatches, costs, limits, flags);
    if (!greedy.warm_up()) continue;
    const bool repeated =
        !made.emplace(flags.fill_small_gaps, flags.prioritize_i, greedy.warm_up_counts()).second;
    if (repeated && o.prune_candidates) continue;
    // Stopped early once it cannot beat the best so far (it would not be kept).
    keep(o.prune_candidates && best ? greedy.finish(best->second.makespan) : greedy.finish());
  }
  // The fixed orders, where they fit: a tight budget can leave the greedy no better.
  for (Schedule (*make)(int, int) : {make_1f1b_split, make_zb_h1, make_zb_h2}) {
    Schedule fixed = make(o.ranks, o.microbatches);
    if (!within_limits(fixed, costs, given)) continue;
    const std::optional<ScheduleTiming> timing = timed_in_order(fixed, costs);
    PPTRAIN_ASSERT(timing.has_value(), "zb-auto: the fixed order ", fixed.name, " deadlocks");
    fixed.name = "zb-auto";
    keep(std::make_pair(std::move(fixed), *timing));
  }
  // At a limit >= the largest activation, F, I, W one microbatch at a time always fits.
  PPTRAIN_ASSERT(best.has_value(), "zb-auto found no schedule for P=", o.ranks,
                 " M=", o.microbatches, " at memory limit ", o.memory_limit);
  if (predicted_cost) *predicted_cost = best->second.span;
  return std::move(best->first);
}

}  // namespace pptrain
