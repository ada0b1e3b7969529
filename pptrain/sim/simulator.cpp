#include "pptrain/sim/simulator.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <sstream>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/sim/metrics.h"

namespace pptrain {
namespace {

constexpr double kNotYet = -1;  // all real times are >= 0

// Times at which things happened, indexed by (stage, microbatch).
struct Table {
  int microbatches = 0;
  std::vector<double> at;
  Table(int stages, int mbs) : microbatches(mbs), at(static_cast<size_t>(stages) * mbs, kNotYet) {}
  double& operator()(int stage, int mb) {
    return at[static_cast<size_t>(stage) * microbatches + mb];
  }
};

// The plain actions inside `a` (its parts for a composite, else `a` itself), without copying:
// the simulator asks for them on every step.
struct Atoms {
  const Action* first;
  const Action* last;
  const Action* begin() const { return first; }
  const Action* end() const { return last; }
  bool empty() const { return first == last; }
};
Atoms atoms_of(const Action& a) {
  if (a.op == Op::OVERLAP_F_B) return {a.parts.data(), a.parts.data() + a.parts.size()};
  return {&a, &a + 1};
}

// Rejects actions the schedule cannot mean, before any timing.
void check_ranges(const Schedule& schedule) {
  PPTRAIN_CHECK(
      schedule.num_ranks >= 1 && schedule.num_stages >= 1 && schedule.num_microbatches >= 1,
      "cannot simulate schedule '", schedule.name, "': it needs ranks, stages and ",
      "microbatches >= 1, got P=", schedule.num_ranks, ", stages=", schedule.num_stages,
      ", M=", schedule.num_microbatches);
  PPTRAIN_CHECK(static_cast<int>(schedule.stage_to_rank.size()) == schedule.num_stages &&
                    static_cast<int>(schedule.actions.size()) == schedule.num_ranks,
                "cannot simulate schedule '", schedule.name, "': stage_to_rank has ",
                schedule.stage_to_rank.size(), " entries for ", schedule.num_stages,
                " stages and actions ", schedule.actions.size(), " lists for ", schedule.num_ranks,
                " ranks");
  for (int stage = 0; stage < schedule.num_stages; ++stage) {
    const int rank = schedule.stage_to_rank[stage];
    PPTRAIN_CHECK(rank >= 0 && rank < schedule.num_ranks, "cannot simulate schedule '",
                  schedule.name, "': stage ", stage, " is placed on rank ", rank, ", expected 0..",
                  schedule.num_ranks - 1);
  }
  for (int r = 0; r < schedule.num_ranks; ++r) {
    for (const Action& a : schedule.actions[r]) {
      const Atoms atoms = atoms_of(a);
      PPTRAIN_CHECK(!atoms.empty(), "rank ", r, ": empty composite action ", to_string(a));
      for (const Action& atom : atoms) {
        PPTRAIN_CHECK(atom.stage >= 0 && atom.stage < schedule.num_stages && atom.microbatch >= 0 &&
                          atom.microbatch < schedule.num_microbatches,
                      "rank ", r, ": action ", to_string(atom), " is outside the schedule (",
                      schedule.num_stages, " stages, ", schedule.num_microbatches,
                      " microbatches)");
        PPTRAIN_CHECK(atom.op != Op::OVERLAP_F_B, "rank ", r, ": nested composite ", to_string(a));
        PPTRAIN_CHECK(schedule.stage_to_rank[atom.stage] == r, "rank ", r, ": action ",
                      to_string(atom), " belongs to stage ", atom.stage, " which runs on rank ",
                      schedule.stage_to_rank[atom.stage]);
        PPTRAIN_CHECK(!(atom.op == Op::RECV_F && atom.stage == 0) &&
                          !(atom.op == Op::RECV_B && atom.stage == schedule.num_stages - 1),
                      "rank ", r, ": ", to_string(atom), " receives from a stage that does not ",
                      "exist");
      }
    }
  }
}

class Simulation {
 public:
  Simulation(const Schedule& schedule, const CostModel& cost)
      : s_(schedule),
        cost_(cost),
        forward_end_(s_.num_stages, s_.num_microbatches),
        backward_end_(s_.num_stages, s_.num_microbatches),
        sent_f_(s_.num_stages, s_.num_microbatches),
        sent_b_(s_.num_stages, s_.num_microbatches),
        received_f_(s_.num_stages, s_.num_microbatches),
        received_b_(s_.num_stages, s_.num_microbatches) {}

  SimResult run() {
    const int P = s_.num_ranks;
    position_.assign(P, 0);
    free_at_.assign(P, 0.0);
    memory_events_.assign(P, {});

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
    report_stuck_rank();
    return result();
  }

 private:
  int rank_of(int stage) const { return s_.stage_to_rank[stage]; }

  // When the input `atom` needs is available on rank r, or kNotYet; `waiting` names what it waits
  // for. Inputs from another rank come through that rank's RECV (which a lowered schedule has).
  double input_ready(const Action& atom, int r, Action* waiting) {
    const int st = atom.stage, mb = atom.microbatch, last = s_.num_stages - 1;
    // Op::I here stands for "the backward, I or B".
    const auto need = [&](double t, Op op, int stage) {
      if (t == kNotYet) *waiting = Action::make(op, stage, mb);
      return t;
    };
    switch (atom.op) {
      case Op::F:
        if (st == 0) return 0;
        if (rank_of(st - 1) == r) return need(forward_end_(st - 1, mb), Op::F, st - 1);
        return need(received_f_(st, mb), Op::RECV_F, st);
      case Op::I:
      case Op::B: {
        const double own = need(forward_end_(st, mb), Op::F, st);
        if (own == kNotYet || st == last) return own;
        const double grad = rank_of(st + 1) == r ? need(backward_end_(st + 1, mb), Op::I, st + 1)
                                                 : need(received_b_(st, mb), Op::RECV_B, st);
        return grad == kNotYet ? kNotYet : std::max(own, grad);
      }
      case Op::W:
        return need(backward_end_(st, mb), Op::I, st);
      case Op::SEND_F:
        return need(forward_end_(st, mb), Op::F, st);
      case Op::SEND_B:
        return need(backward_end_(st, mb), Op::I, st);
      case Op::RECV_F: {
        const double sent = need(sent_f_(st - 1, mb), Op::SEND_F, st - 1);
        return sent == kNotYet ? kNotYet : sent + cost_.comm;
      }
      case Op::RECV_B: {
        const double sent = need(sent_b_(st + 1, mb), Op::SEND_B, st + 1);
        return sent == kNotYet ? kNotYet : sent + cost_.comm;
      }
      default:
        PPTRAIN_ASSERT(false, "composite passed as an atom");
    }
  }

  // Runs rank r's next action if its inputs are available; false if it has to wait.
  bool step(int r) {
    const Action& a = s_.actions[r][position_[r]];
    const Atoms atoms = atoms_of(a);
    double start = free_at_[r];
    for (const Action& atom : atoms) {
      const double ready = input_ready(atom, r, &waiting_);
      if (ready == kNotYet) return false;
      start = std::max(start, ready);
    }
    const double end = start + cost_.time(a, s_.num_stages, s_.num_ranks);
    for (const Action& atom : atoms) {
      record(atom, r, start, end);
      wake_consumer_of(atom);
    }
    events_.push_back(TimelineEvent{r, a, start, end});
    free_at_[r] = end;
    ++position_[r];
    return true;
  }

  // Queues the rank that consumes what `atom` produced: the next stage's for a forward, the
  // previous stage's for a backward (through SEND/RECV when they are on different ranks).
  void wake_consumer_of(const Action& atom) {
    int stage = -1;
    if (atom.op == Op::F || atom.op == Op::SEND_F) stage = atom.stage + 1;
    if (is_backward(atom.op) || atom.op == Op::SEND_B) stage = atom.stage - 1;
    if (stage < 0 || stage >= s_.num_stages) return;
    const int rank = rank_of(stage);
    if (!queued_[rank]) {
      queued_[rank] = true;
      work_.push_back(rank);
    }
  }

  void record(const Action& atom, int r, double start, double end) {
    const int st = atom.stage, mb = atom.microbatch;
    const double activation = cost_.activation(st, s_.num_stages, s_.num_ranks);
    switch (atom.op) {
      case Op::F:
        forward_end_(st, mb) = end;
        memory_events_[r].emplace_back(start, activation);
        break;
      case Op::I:
        backward_end_(st, mb) = end;
        memory_events_[r].emplace_back(end, -activation);
        if (const double stash = cost_.weight_stash(st, s_.num_stages)) {
          memory_events_[r].emplace_back(end, stash);
        }
        break;
      case Op::B:
        backward_end_(st, mb) = end;
        memory_events_[r].emplace_back(end, -activation);
        break;
      case Op::W:
        if (const double stash = cost_.weight_stash(st, s_.num_stages)) {
          memory_events_[r].emplace_back(end, -stash);
        }
        break;
      case Op::SEND_F:
        sent_f_(st, mb) = end;
        break;
      case Op::SEND_B:
        sent_b_(st, mb) = end;
        break;
      case Op::RECV_F:
        received_f_(st, mb) = end;
        break;
      case Op::RECV_B:
        received_b_(st, mb) = end;
        break;
      default:
        break;
    }
  }

  void report_stuck_rank() {
    for (int r = 0; r < s_.num_ranks; ++r) {
      if (position_[r] == static_cast<int>(s_.actions[r].size())) continue;
      const Action& a = s_.actions[r][position_[r]];
      const Atoms atoms = atoms_of(a);
      for (const Action& atom : atoms) {
        if (input_ready(atom, r, &waiting_) == kNotYet) break;
      }
      const std::string what = waiting_.op == Op::I
                                   ? "the backward (I or B) of stage " +
                                         std::to_string(waiting_.stage) + ", microbatch " +
                                         std::to_string(waiting_.microbatch)
                                   : to_string(waiting_);
      PPTRAIN_CHECK(false, "schedule '", s_.name, "' cannot run: rank ", r, " is stuck at ",
                    to_string(a), " waiting for ", what,
                    ", which never happens (a dependency cycle, or a missing or misplaced action)");
    }
  }

  SimResult result() {
    SimResult out;
    out.timeline.title = s_.name + ", P=" + std::to_string(s_.num_ranks) +
                         ", M=" + std::to_string(s_.num_microbatches);
    if (s_.chunks() > 1) out.timeline.title += ", V=" + std::to_string(s_.chunks());
    out.timeline.num_ranks = s_.num_ranks;
    out.timeline.events = std::move(events_);
    const TimelineStats stats = timeline_stats(out.timeline);
    out.makespan = stats.makespan;
    out.cost = stats.cost;
    out.bubble_ratio = stats.bubble_ratio;
    for (int r = 0; r < s_.num_ranks; ++r) {
      out.ranks.push_back(RankStats{r, stats.busy[r], stats.idle[r], peak_memory(r)});
    }
    return out;
  }

  double peak_memory(int r) {
    auto& events = memory_events_[r];
    // At equal times, release before allocating: an I that ends when the next F starts does
    // not overlap it.
    std::sort(events.begin(), events.end());
    double held = 0, peak = 0;
    for (const auto& e : events) {
      held += e.second;
      peak = std::max(peak, held);
    }
    return peak;
  }

  const Schedule& s_;
  const CostModel& cost_;
  Table forward_end_, backward_end_;  // end of F / of I or B, per (stage, microbatch)
  Table sent_f_, sent_b_;             // when the SEND left, keyed by the sending stage
  Table received_f_, received_b_;     // when the RECV completed, keyed by the receiving stage
  std::vector<int> position_;         // [rank] next action to run
  std::vector<double> free_at_;       // [rank] end of its last action
  std::vector<std::vector<std::pair<double, double>>> memory_events_;  // [rank] (time, +/-)
  std::vector<TimelineEvent> events_;
  Action waiting_;            // what the last blocked action waits for (I: I or B)
  std::deque<int> work_;      // ranks to try to advance
  std::vector<bool> queued_;  // [rank] is in work_
};

}  // namespace

SimResult simulate(const Schedule& schedule, const CostModel& cost) {
  check_ranges(schedule);  // before lowering, which indexes stage_to_rank by stage
  const Schedule lowered = lower(schedule);
  return Simulation(lowered, cost).run();
}

}  // namespace pptrain
