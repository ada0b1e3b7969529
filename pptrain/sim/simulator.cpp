#include "pptrain/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/sim/metrics.h"

namespace pptrain {
namespace {

constexpr double kNotYet = -1;  // all real times are >= 0

// A rank's activations held over time, and their peak. Changes come in time order (a rank runs
// its actions one after another); those at one moment apply in increasing order, releases
// first: an I that ends when the next F starts does not overlap it. The same figure, bit for
// bit, as all changes sorted by (time, change) and summed in that order, without keeping them.
class HeldActivations {
 public:
  void change(double time, double bytes) {
    PPTRAIN_ASSERT(time >= time_, "memory change at ", time, " after one at ", time_);
    if (!now_.empty() && time != time_) settle();
    time_ = time;
    now_.push_back(bytes);
  }
  double peak() {
    settle();
    return peak_;
  }

 private:
  void settle() {
    // Mostly one or two changes (an F's; an I's release and stash): sorted without a call.
    if (now_.size() == 2) {
      if (now_[1] < now_[0]) std::swap(now_[0], now_[1]);
    } else if (now_.size() > 2) {
      std::sort(now_.begin(), now_.end());
    }
    for (double bytes : now_) {
      held_ += bytes;
      peak_ = std::max(peak_, held_);
    }
    now_.clear();
  }
  double time_ = -std::numeric_limits<double>::infinity();
  std::vector<double> now_;  // the changes at time_, not yet applied
  double held_ = 0, peak_ = 0;
};

class Simulation {
 public:
  Simulation(const ValidatedSchedule& validated, const CostModel& cost, const VersionRule& rule,
             Record record)
      :  // Figures only, on a core per rank, of a schedule whose messages lower() places (no
         // skip messages, no replicas): a RECV right before its consumer changes nothing but
         // when the consumer starts, at its input's end plus the latency, and a SEND right after
         // its producer nothing at all (their zero-length events never widen a rank's span). So
         // the run takes the compute-only lists as given and a compute action waits for its
         // producer itself: the same figures, bit for bit, without the messages.
        direct_(record == Record::kFigures && validated.lowered_here() &&
                validated.given().skips.empty() && !validated.given().replicated() &&
                cost.cores == 0 && !cost.counts_overheads()),
        s_(direct_ ? validated.given() : *validated),
        cost_(cost),
        rule_(rule),
        record_(record),
        done_at_(s_, kNotYet, /*messages=*/!direct_),
        shares_(s_.shares()),
        stage_figures_(static_cast<size_t>(s_.num_stages) * kStageFigures,
                       std::numeric_limits<double>::quiet_NaN()),
        tally_(s_.num_ranks),
        action_overhead_(cost.overhead(Action::make(Op::F, 0, 0))),
        send_overhead_(cost.overhead(Action::make(Op::SEND_F, 0, 0))),
        recv_overhead_(cost.overhead(Action::make(Op::RECV_F, 0, 0))) {}

  SimResult run() {
    const int P = s_.num_ranks;
    position_.assign(P, 0);
    free_at_.assign(P, 0.0);
    reduce_free_at_.assign(P, 0.0);
    waiting_reductions_.assign(P, {});
    held_.assign(P, {});
    queued_.assign(P, false);
    if (record_ == Record::kTimeline) {
      size_t actions = 0;  // every action is one event: grown one by one, the copies cost more
      for (const auto& list : s_.actions) actions += list.size();
      events_.reserve(actions);
    }
    if (cost_.cores > 0) return run_on_shared_cores();

    // Each rank's list is a fixed order, so an action's start is fixed once its inputs are
    // known. Advance a rank as far as it can go; a rank that has to wait is tried again only
    // when a neighbour produces something it may need. Linear in the number of actions.
    queued_.assign(P, true);
    for (int r = 0; r < P; ++r) work_.push_back(r);
    while (!work_.empty()) {
      const int r = work_.front();
      work_.pop_front();
      queued_[r] = false;
      while (position_[r] < static_cast<int>(s_.actions[r].size()) && step(r)) {
      }
    }
    reduce_replicas();
    for (int r = 0; r < P; ++r) {
      // The validator ran this schedule under the same rules and found no deadlock.
      PPTRAIN_ASSERT(position_[r] == static_cast<int>(s_.actions[r].size()), "schedule '", s_.name,
                     "' stuck on rank ", r, " at ", to_string(s_.actions[r][position_[r]]));
    }
    return result();
  }

 private:
  // The ranks share cost_.cores cores: a global clock, advanced from event to event. Between
  // two events the k tasks that need a core each progress at min(1, cores / k) of their speed.
  // A task is a rank's running compute action, or the REDUCE_GRAD at the head of a rank's
  // reduction channel: an all-reduce between processes of one host copies and sums its bytes
  // on a core too, beside the rank's compute (a replicated schedule's reductions are timed
  // after the run, as in run(), and take no core). SEND and RECV take none. An event is a task
  // ending or a waiting rank's inputs arriving. With a core per task this gives run()'s times.
  SimResult run_on_shared_cores() {
    const int P = s_.num_ranks;
    std::vector<double> left(P, 0);  // [rank] work left of its running compute action
    std::vector<double> began(P, 0);
    std::vector<bool> running(P, false);
    // [rank] its REDUCE_GRADs not yet ended, in order; the head runs, from reduce_began[rank],
    // with reduce_left[rank] of work left.
    std::vector<std::deque<Action>> reductions(P);
    std::vector<double> reduce_left(P, 0), reduce_began(P, 0);
    const bool own_channel = !s_.replicated();
    const auto done = [&](int r) { return position_[r] == static_cast<int>(s_.actions[r].size()); };
    // When rank r's next action can start: kNotYet if an input is not known yet.
    const auto ready_at = [&](int r) {
      double ready = free_at_[r];
      for (const Action& atom : atoms_of(s_.actions[r][position_[r]])) {
        const double t = input_ready(atom, r);
        if (t == kNotYet) return kNotYet;
        ready = std::max(ready, t);
      }
      return ready;
    };
    constexpr double kEps = 1e-12;
    double now = 0;
    while (true) {
      // Start everything that can start now; actions without a core complete at once.
      for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < P; ++r) {
          while (!running[r] && !done(r)) {
            const Action& a = s_.actions[r][position_[r]];
            if (is_collective(a.op)) {
              if (own_channel) {
                if (reductions[r].empty()) {
                  reduce_left[r] = duration(a);
                  reduce_began[r] = now;
                }
                reductions[r].push_back(a);
                ++position_[r];
              } else {
                step(r);
              }
              moved = true;
              continue;
            }
            const double ready = ready_at(r);
            if (ready == kNotYet || ready > now + kEps) break;
            moved = true;
            if (!is_compute(a.op)) {
              step(r);
              continue;
            }
            running[r] = true;
            began[r] = now;
            left[r] = duration(a);
          }
        }
      }
      int tasks = 0;
      for (int r = 0; r < P; ++r) tasks += (running[r] ? 1 : 0) + (reductions[r].empty() ? 0 : 1);
      const double rate = tasks == 0 ? 1 : std::min(1.0, cost_.cores / tasks);
      double next = -1;
      const auto consider = [&next](double t) {
        if (t >= 0 && (next < 0 || t < next)) next = t;
      };
      for (int r = 0; r < P; ++r) {
        if (!reductions[r].empty()) consider(now + reduce_left[r] / rate);
        if (running[r]) {
          consider(now + left[r] / rate);
        } else if (!done(r)) {
          const double ready = ready_at(r);
          if (ready != kNotYet && ready > now + kEps) consider(ready);
        }
      }
      if (next < 0) break;  // finished, or stuck (checked below)
      for (int r = 0; r < P; ++r) {
        if (reductions[r].empty()) continue;
        reduce_left[r] -= (next - now) * rate;
        if (reduce_left[r] > kEps * std::max(1.0, next)) continue;
        note(TimelineEvent{r, reductions[r].front(), reduce_began[r], next});
        reductions[r].pop_front();
        if (reductions[r].empty()) continue;
        reduce_left[r] = duration(reductions[r].front());
        reduce_began[r] = next;
      }
      for (int r = 0; r < P; ++r) {
        if (!running[r]) continue;
        left[r] -= (next - now) * rate;
        if (left[r] > kEps * std::max(1.0, next)) continue;
        const Action& a = s_.actions[r][position_[r]];
        record(a, r, began[r], next);
        note(TimelineEvent{r, a, began[r], next});
        free_at_[r] = next + action_overhead_;  // the executor's bookkeeping, at full speed
        ++position_[r];
        running[r] = false;
      }
      now = next;
    }
    reduce_replicas();
    for (int r = 0; r < P; ++r) {
      PPTRAIN_ASSERT(done(r), "schedule '", s_.name, "' stuck on rank ", r, " at ",
                     to_string(s_.actions[r][position_[r]]));
    }
    return result();
  }

  // When everything `atom` of rank r waits for (inputs_of, semantics.h) is available there, or
  // kNotYet. A message arrives `comm` after its SEND (direct_: after its producer's end).
  double input_ready(const Action& atom, int r) const {
    double ready = 0;
    for (const Need& need : inputs_of(atom, s_, /*lowered=*/!direct_)) {
      // direct_: a producer on rank r came earlier in its list (the validator checked the order),
      // so it ended by free_at_[r], which bounds the start anyway. Not looked up: a backward's own
      // forward ran about 2P microbatches earlier, and at P = 256 its entry is long out of cache.
      const bool message =
          direct_ ? s_.rank_of(need.stage, need.microbatch) != r : is_sent(need.fact);
      if (direct_ && !message) continue;
      const double t = done_at_[need];
      if (t == kNotYet) return kNotYet;
      ready = std::max(ready, message ? t + cost_.message_latency(atom) : t);
    }
    return ready;
  }

  // How long `a` runs: the cost model's time, plus the rerun forward of a backward under a rule
  // whose backward rebuilds the graph on its own weights (pipemare).
  double duration(const Action& a) {
    double time = 0;
    if (a.op == Op::OVERLAP_F_B) {
      for (const Action& part : a.parts()) time += stage_figure(part.stage, part.op);
    } else if (is_compute(a.op)) {
      time = stage_figure(a.stage, a.op);
    } else {
      time = cost_.time(a, s_.num_stages, shares_);
    }
    if (!rule_.backward_reruns_forward()) return time;
    for (const Action& atom : atoms_of(a)) {
      if (atom.op == Op::B || atom.op == Op::I) time += stage_figure(atom.stage, Op::F);
    }
    return time;
  }

  // What the cost model gives a stage, asked once per run (it checks the stage's values the
  // first time, as when asked for every action): the time of its F, I, W or B (`what`), its
  // activations (kActivation) or the share its W keeps (kStash).
  static constexpr int kActivation = static_cast<int>(Op::B) + 1, kStash = kActivation + 1;
  double stage_figure(int stage, Op op) { return stage_figure(stage, static_cast<int>(op)); }
  double stage_figure(int stage, int what) {
    double& figure = stage_figures_[static_cast<size_t>(stage) * kStageFigures + what];
    if (!std::isnan(figure)) return figure;
    if (what == kActivation) {
      figure = cost_.activation(stage, s_.num_stages, shares_);
    } else if (what == kStash) {
      figure = cost_.weight_stash(stage, s_.num_stages, shares_);
    } else {
      figure = cost_.time(Action::make(static_cast<Op>(what), stage, 0), s_.num_stages, shares_);
    }
    return figure;
  }

  // Runs rank r's next action if its inputs are available; false if it has to wait.
  bool step(int r) {
    const Action& a = s_.actions[r][position_[r]];
    if (is_collective(a.op)) {
      reduce(r, a);
      return true;
    }
    double start = free_at_[r];
    for (const Action& atom : atoms_of(a)) {
      const double ready = input_ready(atom, r);
      if (ready == kNotYet) return false;
      start = std::max(start, ready);
    }
    // A message's overhead is its event (a SEND's message leaves at its end); a compute action's
    // follows its event, so that the event stays its compute.
    const bool compute = is_compute(a.op);
    const double end = start + duration(a) + (compute ? 0 : message_overhead(a));
    record(a, r, start, end);
    for (const Action& atom : atoms_of(a)) wake_consumer_of(atom);
    note(TimelineEvent{r, a, start, end});
    free_at_[r] = compute ? end + action_overhead_ : end;
    ++position_[r];
    return true;
  }

  double message_overhead(const Action& a) const {
    if (is_send(a.op)) return send_overhead_;
    return is_recv(a.op) ? recv_overhead_ : 0;
  }

  // A REDUCE_GRAD starts once the rank has reached it (its previous action ended; the validator
  // put it after the stage's last W or B) and the rank's reduction channel is free, and runs on
  // that channel: the rank's next actions do not wait for it, nothing else does either.
  void reduce(int r, const Action& a) {
    if (s_.replicated()) {
      waiting_reductions_[r].push_back({a, free_at_[r]});
      ++position_[r];
      return;
    }
    const double start = std::max(free_at_[r], reduce_free_at_[r]);
    const double end = start + duration(a);
    note(TimelineEvent{r, a, start, end});
    reduce_free_at_[r] = end;
    ++position_[r];
  }

  // The reductions of a replicated schedule, once every rank has reached its own: a reduction
  // over a stage's replicas starts on each when it has reached it and its channel is free, and
  // ends for all of them at the latest start plus CostModel::reduce_time over the replica count.
  // The validator checked that the replicas reduce in one order, so this always finishes.
  void reduce_replicas() {
    std::vector<std::vector<int>> queues(s_.num_ranks);  // [rank] the stages it reduces
    for (int r = 0; r < s_.num_ranks; ++r) {
      for (const auto& w : waiting_reductions_[r]) queues[r].push_back(w.action.stage);
    }
    std::vector<size_t> head;
    std::vector<size_t> next(s_.num_ranks, 0);  // [rank] its next reduction to time
    for (int stage : match_replica_reductions(s_, queues, head)) {
      const std::vector<int> replicas = s_.replicas_of(stage);
      double latest = 0;
      std::vector<double> start(replicas.size());
      for (size_t k = 0; k < replicas.size(); ++k) {
        const int q = replicas[k];
        start[k] = std::max(waiting_reductions_[q][next[q]].reached, reduce_free_at_[q]);
        latest = std::max(latest, start[k]);
      }
      const double end = latest + cost_.reduce_time(stage, s_.num_stages, shares_,
                                                    static_cast<int>(replicas.size()));
      for (size_t k = 0; k < replicas.size(); ++k) {
        const int q = replicas[k];
        note(TimelineEvent{q, waiting_reductions_[q][next[q]++].action, start[k], end});
        reduce_free_at_[q] = end;
      }
    }
    for (int r = 0; r < s_.num_ranks; ++r) {
      PPTRAIN_ASSERT(next[r] == queues[r].size(), "schedule '", s_.name, "': a reduction on rank ",
                     r, " never ends");
    }
  }

  // Queues the rank that consumes what `atom` produced: the next stage's for a forward, the
  // previous stage's for a backward (through SEND/RECV when they are on different ranks), the
  // other end's for a skip message.
  void wake_consumer_of(const Action& atom) {
    int stage = -1;
    if (atom.op == Op::F || atom.op == Op::SEND_F) stage = atom.stage + 1;
    if (is_backward(atom.op) || atom.op == Op::SEND_B) stage = atom.stage - 1;
    if (is_skip_message(atom)) stage = is_send(atom.op) ? atom.peer : -1;
    if (stage < 0 || stage >= s_.num_stages) return;
    const int rank = s_.rank_of(stage, atom.microbatch);
    if (!queued_[rank]) {
      queued_[rank] = true;
      work_.push_back(rank);
    }
  }

  // An event of the run: counted in the figures, and kept when the timeline is asked for.
  void note(const TimelineEvent& event) {
    tally_.add(event.rank, event.action.op, event.start, event.end);
    if (record_ == Record::kTimeline) events_.push_back(event);
  }

  // Compute action `a` of rank r ran from `start` to `end`: the facts of its atoms hold from its
  // end, and what they keep or release changes the rank's activations (changes at the start
  // first: a rank's changes come in time order).
  void record(const Action& a, int r, double start, double end) {
    for (const Action& atom : atoms_of(a)) {
      done_at_[produced_by(atom)] = end;
      if (atom.op == Op::F) held_[r].change(start, stage_figure(atom.stage, kActivation));
    }
    for (const Action& atom : atoms_of(a)) {
      if (is_backward(atom.op)) held_[r].change(end, -stage_figure(atom.stage, kActivation));
      if (atom.op != Op::I && atom.op != Op::W) continue;
      // I keeps, and W releases, the share of the activations the weight gradients need.
      const double stash = stage_figure(atom.stage, kStash);
      if (stash != 0) held_[r].change(end, atom.op == Op::I ? stash : -stash);
    }
  }

  SimResult result() {
    SimResult out;
    out.timeline.title = s_.name + ", P=" + std::to_string(s_.num_ranks) +
                         ", M=" + std::to_string(s_.num_microbatches);
    if (s_.chunks() > 1) out.timeline.title += ", V=" + std::to_string(s_.chunks());
    out.timeline.num_ranks = s_.num_ranks;
    out.timeline.events = std::move(events_);
    const TimelineStats stats = tally_.stats();
    out.makespan = stats.makespan;
    out.cost = stats.cost;
    out.bubble_ratio = stats.bubble_ratio;
    std::vector<int> versions = weight_versions_per_rank(rule_, s_.stage_to_rank, s_.num_ranks);
    std::vector<double> weights(s_.num_ranks, 0.0);  // [rank] all versions of its stages
    for (int r = 0; r < s_.num_ranks; ++r) {
      // Every replica holds its stage's weights (stages_of lists them all).
      if (s_.replicated()) versions[r] = 1;
      for (int st : s_.stages_of(r)) {
        weights[r] += rule_.versions_kept(st) * cost_.weight_memory(st, s_.num_stages, shares_);
        if (s_.replicated()) versions[r] = std::max(versions[r], rule_.versions_kept(st));
      }
    }
    for (int r = 0; r < s_.num_ranks; ++r) {
      const double activations = held_[r].peak();
      out.ranks.push_back(RankStats{r, stats.busy[r], stats.idle[r], activations, versions[r],
                                    activations + weights[r]});
    }
    return out;
  }

  const bool direct_;  // the compute-only lists, messages timed from their producer and consumer
  const Schedule& s_;  // the lowered schedule, or (direct_) the compute-only one
  const CostModel& cost_;
  const VersionRule& rule_;
  const Record record_;
  FactTable<double> done_at_;  // when each fact came true (semantics.h); kNotYet until then
  // The ranks the cost model splits the model over: with replicated stages every stage is one
  // rank's whole share (V = 1), however many ranks hold replicas.
  int shares_;
  static constexpr int kStageFigures = kStash + 1;
  // [stage * kStageFigures + what] stage_figure()'s, NaN until asked for
  std::vector<double> stage_figures_;
  std::vector<int> position_;           // [rank] next action to run
  std::vector<double> free_at_;         // [rank] end of its last action
  std::vector<double> reduce_free_at_;  // [rank] end of its last REDUCE_GRAD (one channel)
  // A replicated schedule's reduction and when its rank reached it, resolved after the run.
  struct WaitingReduction {
    Action action;
    double reached = 0;
  };
  std::vector<std::vector<WaitingReduction>> waiting_reductions_;  // [rank] in list order
  std::vector<HeldActivations> held_;                              // [rank]
  TimelineTally tally_;                                            // the figures, event by event
  std::vector<TimelineEvent> events_;                              // with Record::kTimeline
  std::deque<int> work_;                                           // ranks to try to advance
  std::vector<bool> queued_;                                       // [rank] is in work_
  // CostModel::overhead of a compute action, a SEND and a RECV (checked once).
  const double action_overhead_, send_overhead_, recv_overhead_;
};

}  // namespace

SimResult simulate(const ValidatedSchedule& schedule, const CostModel& cost,
                   const VersionRule& rule, Record record) {
  PPTRAIN_CHECK(!rule.asynchronous() || rule.stages == schedule.given().num_stages, "weight rule ",
                rule.name(), " is for ", rule.stages, " stages but schedule '",
                schedule.given().name, "' has ", schedule.given().num_stages);
  return Simulation(schedule, cost, rule, record).run();
}

double predicted_step_ms(const ValidatedSchedule& schedule, const VersionRule& rule,
                         const Profile& profile, const std::vector<LayerRange>& stages,
                         const std::vector<double>& stage_scale, int copies) {
  PPTRAIN_ASSERT(stage_scale.empty() || stage_scale.size() == stages.size());
  CostModel cost = cost_from_profile(profile, stages, /*replicas=*/1);
  for (size_t s = 0; s < stage_scale.size(); ++s) {
    for (auto* times :
         {&cost.stage_forward, &cost.stage_backward_input, &cost.stage_backward_weight}) {
      (*times)[s] *= stage_scale[s];
    }
  }
  if (copies > 1) {
    cost.replicas = copies;
    if (cost.reduce_bandwidth <= 0) {
      cost.reduce_bandwidth = kDefaultBandwidthBytesPerS / 1000;  // bytes per ms
    }
  }
  return simulate(schedule, cost, rule, Record::kFigures).makespan;
}

void check_peak_within_limit(const SimResult& result, double limit, const std::string& schedule) {
  if (limit == 0) return;
  for (const RankStats& rank : result.ranks) {
    PPTRAIN_CHECK(rank.peak_activations <= limit + 1e-9, "schedule '", schedule, "' holds ",
                  rank.peak_activations, " units of activations on rank ", rank.rank,
                  ", above --memory-limit ", limit, " (--schedule zb-auto plans under a limit)");
  }
}

}  // namespace pptrain
