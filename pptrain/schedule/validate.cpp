#include "pptrain/schedule/validate.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "pptrain/schedule/grid.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// Ops recorded per (stage, microbatch): F .. RECV_B. Composites are checked through their parts.
constexpr int kAtomOps = static_cast<int>(Op::OVERLAP_F_B);
constexpr int kComputeOps = static_cast<int>(Op::SEND_F);  // F, I, W, B: a compute-only schedule's
// Grids of longer schedules are cut to this many positions either side of the marked action.
constexpr int kGridWindow = 12;
// Deadlock messages list at most this many stuck ranks.
constexpr size_t kMaxStuckListed = 8;

int op_index(Op op) {
  return static_cast<int>(op);
}

// Where an atomic action sits: rank, position in the rank's list, and part index inside a
// composite (0 otherwise). 8 bytes: the validator keeps one per op of every (stage, microbatch).
constexpr int kMaxRanksOrParts = std::numeric_limits<std::int16_t>::max();
struct Where {
  Where() = default;
  Where(int rank, int position, int part)
      : position(position),
        rank(static_cast<std::int16_t>(rank)),
        part(static_cast<std::int16_t>(part)) {}
  int position = -1;
  std::int16_t rank = -1;
  std::int16_t part = 0;

  bool found() const { return rank >= 0; }
  bool before(const Where& other) const {
    return position < other.position || (position == other.position && part < other.part);
  }
};

// Calls fn(atom, part index) for each plain action inside `action` (atoms_of, semantics.h).
template <typename Fn>
void for_each_atom(const Action& action, Fn fn) {
  int part = 0;
  for (const Action& atom : atoms_of(action)) fn(atom, part++);
}

std::string text_of(Op op, int stage, int microbatch) {
  return to_string(Action::make(op, stage, microbatch));
}

class Validator {
 public:
  explicit Validator(const Schedule& schedule) : s_(schedule) {}

  // Runs every check; returns whether the schedule has its messages (else it is compute-only).
  bool run() {
    check_shape();
    M_ = s_.num_microbatches;
    with_comms_ = s_.has_comms();
    ops_ = with_comms_ ? kAtomOps : kComputeOps;
    seen_.assign(static_cast<size_t>(s_.num_stages) * M_ * ops_, {});
    check_skips();
    skip_seen_.assign(s_.skips.size() * M_, {});
    reductions_.assign(static_cast<size_t>(s_.num_stages) * s_.num_ranks, {});
    record_actions();
    check_completeness();
    // A compute-only schedule's run to find deadlocks checks the order on its rank of every
    // action it reaches too; a separate pass does so only to name an error, or past a deadlock.
    std::optional<ComputeRun> compute_run;
    if (!with_comms_) compute_run = run_compute_only();
    if (!compute_run || compute_run->order_broken || any_stuck(compute_run->pc)) check_order();
    check_reductions();
    if (s_.replicated()) check_reduction_order();
    if (with_comms_) {
      check_matching();
      check_deadlock();
    } else {
      fail_if_deadlocked_compute(compute_run->pc);
    }
    return with_comms_;
  }

 private:
  [[noreturn]] void fail(int rank, int position, const std::string& message) const {
    std::string text;
    if (rank >= 0) {
      text = "rank " + std::to_string(rank);
      if (position >= 0) {
        text += ", position " + std::to_string(position) + " (" +
                to_string(s_.actions[rank][position]) + ")";
      }
      text += ": ";
    }
    text += message;
    if (rank >= 0) {
      GridOptions grid;
      grid.mark_rank = rank;
      grid.mark_position = position;
      size_t longest = 0;
      for (const auto& list : s_.actions) longest = std::max(longest, list.size());
      if (longest > 2 * kGridWindow + 8) grid.window = kGridWindow;
      text += "\n" + render_grid(s_, grid);
      while (!text.empty() && text.back() == '\n') text.pop_back();
    }
    throw ScheduleError(rank, position, message, text);
  }
  [[noreturn]] void fail_at(const Where& where, const std::string& message) const {
    fail(where.rank, where.position, message);
  }

  int last_stage() const { return s_.num_stages - 1; }
  Where& slot(Op op, int stage, int microbatch) {
    assert(op_index(op) < ops_ && "a message in a compute-only schedule's table");
    return seen_[(static_cast<size_t>(stage) * M_ + microbatch) * ops_ + op_index(op)];
  }
  // Where an atom is, a skip message's SEND or RECV included (check_peer made sure its link is
  // one of the schedule's).
  Where& slot(const Action& a) {
    if (!is_skip_message(a)) return slot(a.op, a.stage, a.microbatch);
    const size_t k = static_cast<size_t>(s_.skip_index(a.stage, a.peer));
    return skip_seen_[k * M_ + a.microbatch][op_index(a.op) - op_index(Op::SEND_F)];
  }
  // Where the action sits that leaves `need`'s fact (the backward, B or I, for an input
  // gradient).
  const Where& made_at(const Need& need) {
    return need.fact == Fact::kInputGrad ? backward(need.stage, need.microbatch)
                                         : slot(producer_of(need));
  }
  // The backward (B or I) of (stage, microbatch), whichever the schedule has.
  const Where& backward(int stage, int microbatch) {
    const Where& b = slot(Op::B, stage, microbatch);
    return b.found() ? b : slot(Op::I, stage, microbatch);
  }
  std::string backward_text(int stage, int microbatch) {
    return text_of(fused_backward(stage, microbatch) ? Op::B : Op::I, stage, microbatch);
  }
  // Whether (stage, microbatch) has a B rather than an I.
  bool fused_backward(int stage, int microbatch) { return slot(Op::B, stage, microbatch).found(); }

  // The fields agree with each other; nothing here has a rank or position.
  template <typename... Parts>
  void require(bool cond, const Parts&... parts) const {
    if (!cond) fail(-1, -1, detail::concat(parts...));
  }

  void check_shape() const {
    const Schedule& s = s_;
    require(s.num_ranks >= 1 && s.num_ranks <= kMaxRanksOrParts, "schedule has ", s.num_ranks,
            " ranks; expected 1 .. ", kMaxRanksOrParts);
    require(static_cast<int>(s.actions.size()) == s.num_ranks, "schedule has ", s.actions.size(),
            " action lists for ", s.num_ranks, " ranks; expected one list per rank");
    require(s.num_stages >= 1, "schedule has ", s.num_stages, " stages; expected at least 1");
    require(s.num_microbatches >= 1, "schedule has ", s.num_microbatches,
            " microbatches; expected at least 1");
    require(static_cast<int>(s.stage_to_rank.size()) == s.num_stages, "stage_to_rank has ",
            s.stage_to_rank.size(), " entries for ", s.num_stages,
            " stages; expected one per stage");
    std::vector<int> stages_per_rank(s.num_ranks, 0);
    for (int stage = 0; stage < s.num_stages; ++stage) {
      const int r = s.stage_to_rank[stage];
      require(r >= 0 && r < s.num_ranks, "stage ", stage, " is placed on rank ", r,
              "; expected a rank in 0..", s.num_ranks - 1);
      if (!s.replicated()) ++stages_per_rank[r];
    }
    if (s.replicated()) check_placement(stages_per_rank);
    for (int r = 0; r < s.num_ranks; ++r) {
      require(stages_per_rank[r] > 0, "rank ", r, " holds no stage; every rank needs one");
    }
    // Every (stage, microbatch) needs an F and a backward. The tables below hold an entry per
    // (stage, microbatch), so a schedule that lacks most of them (a file such as
    // "0F0,0B999999999" claims M = 10^9) is turned down by counting first. A few missing actions
    // pass here and are named precisely by check_completeness().
    unsigned long long compute = 0;
    for (const auto& list : s.actions) {
      for (const Action& a : list) {
        compute += a.op == Op::OVERLAP_F_B ? a.parts().size() : is_compute(a.op) ? 1 : 0;
      }
    }
    const unsigned long long needed = 2ULL * static_cast<unsigned long long>(s.num_stages) *
                                      static_cast<unsigned long long>(s.num_microbatches);
    require(needed <= 2 * compute + 1024, "schedule has ", compute, " compute actions for ",
            s.num_stages, " stages and ", s.num_microbatches, " microbatches; expected ", needed,
            " (an F and a backward for every stage and microbatch)");
  }

  // A replicated schedule's placement: a rank in range for every (stage, microbatch), and
  // stage_to_rank the stage's lowest replica. Counts the stages each rank holds.
  void check_placement(std::vector<int>& stages_per_rank) const {
    const Schedule& s = s_;
    require(static_cast<int>(s.placement.size()) == s.num_stages, "placement has ",
            s.placement.size(), " rows for ", s.num_stages, " stages; expected one per stage");
    for (int stage = 0; stage < s.num_stages; ++stage) {
      const auto& row = s.placement[stage];
      require(static_cast<int>(row.size()) == s.num_microbatches, "placement of stage ", stage,
              " has ", row.size(), " entries for ", s.num_microbatches,
              " microbatches; expected one per microbatch");
      for (int mb = 0; mb < s.num_microbatches; ++mb) {
        require(row[mb] >= 0 && row[mb] < s.num_ranks, "stage ", stage, " microbatch ", mb,
                " is placed on rank ", row[mb], "; expected a rank in 0..", s.num_ranks - 1);
      }
      const std::vector<int> replicas = s.replicas_of(stage);
      require(replicas.front() == s.stage_to_rank[stage], "stage_to_rank of stage ", stage,
              " is rank ", s.stage_to_rank[stage], " but its lowest replica is rank ",
              replicas.front(), "; a replicated stage's stage_to_rank is its lowest replica");
      for (int r : replicas) ++stages_per_rank[r];
    }
  }

  // The skip links: sorted, distinct, and each between stages more than one apart.
  void check_skips() const {
    for (size_t k = 0; k < s_.skips.size(); ++k) {
      const SkipLink& skip = s_.skips[k];
      require(skip.from >= 0 && skip.from + 1 < skip.to && skip.to < s_.num_stages,
              "a skip from stage ", skip.from, " to stage ", skip.to, " in ", s_.num_stages,
              " stages; a skip goes from a stage to one at least two stages later");
      require(k == 0 || s_.skips[k - 1] < skip,
              "the schedule's skips are not sorted and distinct (stages ", skip.from, " -> ",
              skip.to, ")");
    }
  }

  // Each action by itself: in range, on its rank, a sensible peer, and not a duplicate.
  void record_actions() {
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const Action& action = list[i];
        if (action.op == Op::OVERLAP_F_B) {
          if (action.parts().size() < 2) fail(r, i, "a composite needs at least two parts");
          if (action.parts().size() > kMaxRanksOrParts) {
            fail(r, i, "a composite of more than " + std::to_string(kMaxRanksOrParts) + " parts");
          }
          for (const Action& part : action.parts()) {
            if (!is_compute(part.op) || part.op == Op::OVERLAP_F_B) {
              fail(r, i,
                   "a composite may hold only F, I, W and B actions, not " +
                       std::string(op_name(part.op)));
            }
          }
        }
        if (is_collective(action.op)) {
          record_reduction(action, Where{r, i, 0});
          continue;
        }
        for_each_atom(action, [&](const Action& a, int part) { record(a, Where{r, i, part}); });
      }
    }
  }

  void record(const Action& a, const Where& here) {
    const int r = here.rank, i = here.position;
    if (a.stage < 0 || a.stage >= s_.num_stages) {
      fail(r, i,
           "stage " + std::to_string(a.stage) + " is out of range (the schedule has " +
               std::to_string(s_.num_stages) + " stages, 0.." + std::to_string(s_.num_stages - 1) +
               ")");
    }
    if (a.microbatch < 0 || a.microbatch >= M_) {
      fail(r, i,
           "microbatch " + std::to_string(a.microbatch) + " is out of range (the schedule has " +
               std::to_string(M_) + " microbatches, 0.." + std::to_string(M_ - 1) + ")");
    }
    const int owner = s_.rank_of(a.stage, a.microbatch);
    if (owner != r) {
      fail(r, i,
           "stage " + std::to_string(a.stage) +
               (s_.replicated() ? " microbatch " + std::to_string(a.microbatch) + " runs on rank " +
                                      std::to_string(owner) + " (placement)"
                                : " runs on rank " + std::to_string(owner) + " (stage_to_rank)") +
               ", not on rank " + std::to_string(r));
    }
    if (is_comm(a.op)) check_peer(a, here);

    const int s = a.stage, mb = a.microbatch;
    Where& where = slot(a);
    if (where.found()) {
      fail(r, i,
           "second " + to_string(a) + " (the first is at rank " + std::to_string(where.rank) +
               ", position " + std::to_string(where.position) + ")");
    }
    // A backward is either one B, or an I and a W; never both kinds.
    const bool fused = a.op == Op::B;
    const bool split = a.op == Op::I || a.op == Op::W;
    if (fused || split) {
      // The other kind: I and W for a B, B for an I or a W.
      const Op others[] = {fused ? Op::I : Op::B, Op::W};
      for (int k = 0; k < (fused ? 2 : 1); ++k) {
        const Op other = others[k];
        const Where& o = slot(other, s, mb);
        if (o.found()) {
          fail(r, i,
               "stage " + std::to_string(s) + " microbatch " + std::to_string(mb) +
                   " already has " + text_of(other, s, mb) + " at position " +
                   std::to_string(o.position) + "; a backward is either one B, or an I then a W");
        }
      }
    }
    where = here;
  }

  // A REDUCE_GRAD by itself: a stage in range, held by its rank, no microbatch, one per stage,
  // and a synchronous schedule (an asynchronous one has no step end to reduce at).
  void record_reduction(const Action& a, const Where& here) {
    const int r = here.rank, i = here.position;
    if (!s_.flushes) {
      fail(r, i,
           "a REDUCE_GRAD needs a synchronous schedule; this one does not flush, so its step has "
           "no end to reduce the gradients at");
    }
    if (a.microbatch != -1)
      fail(r, i, "a REDUCE_GRAD has no microbatch (write it as <stage>REDUCE_GRAD)");
    if (a.stage < 0 || a.stage >= s_.num_stages) {
      fail(r, i,
           "stage " + std::to_string(a.stage) + " is out of range (the schedule has " +
               std::to_string(s_.num_stages) + " stages, 0.." + std::to_string(s_.num_stages - 1) +
               ")");
    }
    if (s_.replicated()) {
      const std::vector<int> replicas = s_.replicas_of(a.stage);
      if (std::find(replicas.begin(), replicas.end(), r) == replicas.end()) {
        fail(r, i,
             "rank " + std::to_string(r) + " holds no replica of stage " + std::to_string(a.stage) +
                 ", so it has no gradients of it to reduce");
      }
      if (replicas.size() == 1) {
        fail(r, i,
             "stage " + std::to_string(a.stage) + " has one replica (rank " + std::to_string(r) +
                 "): there is nothing to sum its gradients with");
      }
    } else if (const int owner = s_.stage_to_rank[a.stage]; owner != r) {
      fail(r, i,
           "stage " + std::to_string(a.stage) + " runs on rank " + std::to_string(owner) +
               " (stage_to_rank), so its gradients are reduced there, not on rank " +
               std::to_string(r));
    }
    Where& where = reduction(a.stage, r);
    if (where.found()) {
      fail(r, i,
           "second " + to_string(a) + " (the first is at rank " + std::to_string(where.rank) +
               ", position " + std::to_string(where.position) +
               "); a stage's gradients are reduced once per step");
    }
    where = here;
  }

  // The REDUCE_GRAD of `stage` on `rank` (one per stage without a placement: its rank's).
  Where& reduction(int stage, int rank) {
    return reductions_[static_cast<size_t>(stage) * s_.num_ranks + rank];
  }

  // The reductions a schedule with reductions needs, as (stage, rank): every stage on its rank
  // (data parallelism: the copies are other pipelines), or in a replicated schedule every replica
  // of each stage held by more than one rank (they sum their gradients).
  std::vector<std::pair<int, int>> needed_reductions() const {
    std::vector<std::pair<int, int>> needed;
    for (int s = 0; s < s_.num_stages; ++s) {
      const std::vector<int> replicas = s_.replicas_of(s);
      if (s_.replicated() && replicas.size() < 2) continue;
      for (int r : replicas) needed.emplace_back(s, r);
    }
    return needed;
  }

  // Either every needed reduction is there or none is, and a stage's REDUCE_GRAD comes after
  // every W or B of the stage on its rank (record() checked the placement).
  void check_reductions() {
    const auto needed = needed_reductions();
    int with = -1, without = -1;  // index in `needed` of one that is there, one that is not
    for (int k = 0; k < static_cast<int>(needed.size()); ++k) {
      (reduction(needed[k].first, needed[k].second).found() ? with : without) = k;
    }
    if (with < 0) return;
    if (without >= 0) {
      const auto [stage, rank] = needed[without];
      const Where& other = reduction(needed[with].first, needed[with].second);
      const std::string rule = s_.replicated()
                                   ? "; either every replica of every replicated stage reduces "
                                     "its gradients or none does"
                                   : "; either every stage reduces its gradients or none does";
      fail(rank, -1,
           "stage " + std::to_string(stage) + " has no " +
               to_string(Action::make(Op::REDUCE_GRAD, stage, -1)) +
               (s_.replicated() ? " on rank " + std::to_string(rank) : std::string()) +
               " but stage " + std::to_string(needed[with].first) + " has one (rank " +
               std::to_string(other.rank) + ", position " + std::to_string(other.position) + ")" +
               rule);
    }
    for (int s = 0; s < s_.num_stages; ++s) {
      for (int mb = 0; mb < M_; ++mb) {
        const Where& reduce = reduction(s, s_.rank_of(s, mb));
        if (!reduce.found()) continue;
        const bool fused = slot(Op::B, s, mb).found();
        const Where& grads = fused ? slot(Op::B, s, mb) : slot(Op::W, s, mb);
        if (grads.before(reduce)) continue;
        fail_at(reduce, to_string(Action::make(Op::REDUCE_GRAD, s, -1)) + " runs before " +
                            text_of(fused ? Op::B : Op::W, s, mb) + " (position " +
                            std::to_string(grads.position) +
                            "), whose weight gradients it reduces");
      }
    }
  }

  // The replicas of a stage sum their gradients together, so each waits at its REDUCE_GRAD until
  // all have reached theirs (one reduction after another on a rank, as the simulator and a
  // communicator run them). Two stages with the same replicas reduced in opposite orders on two
  // of them would wait for each other: run the reductions abstractly and fail if some never end.
  void check_reduction_order() {
    std::vector<std::vector<int>> queues(s_.num_ranks);     // [rank] stages it reduces, in order
    std::vector<std::vector<int>> positions(s_.num_ranks);  // [rank] where those are
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        if (!is_collective(list[i].op)) continue;
        queues[r].push_back(list[i].stage);
        positions[r].push_back(i);
      }
    }
    std::vector<size_t> head;
    match_replica_reductions(s_, queues, head);
    const auto waits_at = [&](int r) {
      return head[r] < queues[r].size() ? queues[r][head[r]] : -1;
    };
    for (int r = 0; r < s_.num_ranks; ++r) {
      const int stage = waits_at(r);
      if (stage < 0) continue;
      for (int q : s_.replicas_of(stage)) {
        if (waits_at(q) == stage) continue;
        fail(r, positions[r][head[r]],
             "deadlock: its replica on rank " + std::to_string(q) + " reduces " +
                 (waits_at(q) >= 0 ? "stage " + std::to_string(waits_at(q)) + " first"
                                   : std::string("nothing more")) +
                 "; the replicas of stages reduce their gradients in the same order");
      }
    }
  }

  // A communication action must have a peer stage that exists and lives on another rank.
  void check_peer(const Action& a, const Where& here) const {
    const bool to_next = a.op == Op::SEND_F || a.op == Op::RECV_B;
    if (is_skip_message(a)) {
      const bool later = a.peer > a.stage;
      if (later != to_next || s_.skip_index(a.stage, a.peer) < 0) {
        fail(here.rank, here.position,
             "stage " + std::to_string(a.stage) + " has no skip connection " +
                 (to_next ? "to later" : "from earlier") + " stage " + std::to_string(a.peer) +
                 " (the schedule's skips: " + skips_text() + ")");
      }
    }
    const int peer = is_skip_message(a) ? a.peer : to_next ? a.stage + 1 : a.stage - 1;
    if (peer < 0 || peer > last_stage()) {
      fail(here.rank, here.position,
           "stage " + std::to_string(a.stage) + " has no " + (to_next ? "next" : "previous") +
               " stage to " +
               (a.op == Op::SEND_F || a.op == Op::SEND_B ? "send to" : "receive from"));
    }
    if (s_.rank_of(peer, a.microbatch) == here.rank) {
      fail(here.rank, here.position,
           "stages " + std::to_string(std::min(a.stage, peer)) + " and " +
               std::to_string(std::max(a.stage, peer)) + " are both on rank " +
               std::to_string(here.rank) + "; nothing to communicate");
    }
  }

  std::string skips_text() const {
    std::string text;
    for (const SkipLink& skip : s_.skips) {
      text +=
          (text.empty() ? "" : ", ") + std::to_string(skip.from) + " -> " + std::to_string(skip.to);
    }
    return text.empty() ? "none" : text;
  }

  // Every (stage, microbatch) has one F and one backward (B, or I and W).
  void check_completeness() {
    for (int s = 0; s < s_.num_stages; ++s) {
      for (int mb = 0; mb < M_; ++mb) {
        const auto what = [&] {
          return "stage " + std::to_string(s) + " microbatch " + std::to_string(mb);
        };
        const Where &f = slot(Op::F, s, mb), &i = slot(Op::I, s, mb), &w = slot(Op::W, s, mb),
                    &b = slot(Op::B, s, mb);
        if (!f.found()) {
          const Where& any = b.found() ? b : i.found() ? i : w;
          if (!any.found()) {
            fail(s_.rank_of(s, mb), -1,
                 what() + " has no actions (expected " + text_of(Op::F, s, mb) + " and " +
                     text_of(Op::B, s, mb) + ", or " + text_of(Op::F, s, mb) + ", " +
                     text_of(Op::I, s, mb) + " and " + text_of(Op::W, s, mb) + ")");
          }
          fail_at(any, what() + " has no forward " + text_of(Op::F, s, mb));
        }
        if (w.found() && !i.found()) {
          fail_at(w, text_of(Op::W, s, mb) + " has no " + text_of(Op::I, s, mb) +
                         " (a W follows the I of its microbatch)");
        }
        if (!b.found() && !i.found()) {
          fail_at(f, "forward of " + what() + " has no backward (expected " +
                         text_of(Op::B, s, mb) + ", or " + text_of(Op::I, s, mb) + " then " +
                         text_of(Op::W, s, mb) + ")");
        }
        if (i.found() && !w.found()) {
          fail_at(i, text_of(Op::I, s, mb) + " has no " + text_of(Op::W, s, mb) +
                         " (the weight gradient is never computed)");
        }
      }
    }
  }

  // What a failed dependency check says: "<what> runs before <dep> (position j, <role>)".
  struct DepText {
    std::string what, dep, role;
  };

  // Requires `dep` to come before `here` on the same rank. `describe` builds the message's parts
  // and is called only on failure: this check runs for every action of large schedules, so its
  // test is inline and the rest (which takes the lambda) is not.
  template <typename Describe>
  void require_before(const Where& here, const Where& dep, const Describe& describe) {
    if (dep.found() && dep.before(here)) return;
    fail_order(here, dep, describe());
  }
  [[noreturn]] void fail_order(const Where& here, const Where& dep, const DepText& text) {
    if (!dep.found()) {
      const std::string role = text.role.empty() ? "" : " (" + text.role + ")";
      fail_at(here, text.what + " needs " + text.dep + role + ", but the schedule has none");
    }
    const std::string role = text.role.empty() ? "" : ", " + text.role;
    fail_at(here, text.what + " runs before " + text.dep + " (position " +
                      std::to_string(dep.position) + role + ")");
  }

  // Dependencies inside one rank, in list order. Across ranks, order is the deadlock check's.
  void check_order() {
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        for_each_atom(list[i], [&](const Action& a, int part) {
          check_deps(a, Where{r, i, part});
        });
      }
    }
  }

  // Every input that `a` waits for and that its own rank produces must come earlier in the
  // list (inputs_of, semantics.h). Inputs from other ranks are ordered by the deadlock check.
  void check_deps(const Action& a, const Where& here) {
    for (const Need& need : inputs_of(a, s_, with_comms_)) {
      if (s_.rank_of(need.stage, need.microbatch) != here.rank) continue;
      require_before(here, made_at(need), [&] { return describe(a, need); });
    }
  }

  // How a failed dependency reads: "forward of stage 1 microbatch 0 runs before 1RECV_F0 ...".
  DepText describe(const Action& a, const Need& need) {
    const int s = a.stage, mb = a.microbatch;
    const auto of = [&](const char* kind) {
      return std::string(kind) + " of stage " + std::to_string(s) + " microbatch " +
             std::to_string(mb);
    };
    const auto from_rank = [&](const char* what, int stage) {
      return std::string(what) + std::to_string(s_.rank_of(stage, mb));
    };
    const std::string what = a.op == Op::F       ? of("forward")
                             : a.op == Op::W     ? of("weight backward")
                             : is_backward(a.op) ? of("backward")
                                                 : to_string(a);
    const bool send = a.op == Op::SEND_F || a.op == Op::SEND_B;
    switch (need.fact) {
      case Fact::kOutput:
        if (send) return {what, text_of(Op::F, s, mb), "it produces the output sent"};
        if (need.stage != s) return {what, "its input's forward " + text_of(Op::F, s - 1, mb), ""};
        return {what, "its forward " + text_of(Op::F, s, mb), ""};
      case Fact::kInputGrad:
        if (send) return {what, backward_text(s, mb), "it produces the input gradient sent"};
        if (a.op == Op::W) return {what, text_of(Op::I, s, mb), ""};
        return {what, backward_text(need.stage, mb), "it produces the output gradient"};
      case Fact::kReceivedF:
        return {what, text_of(Op::RECV_F, s, mb),
                from_rank("it receives the input from rank ", s - 1)};
      case Fact::kReceivedB:
        return {what, text_of(Op::RECV_B, s, mb),
                from_rank("it receives the output gradient from rank ", s + 1)};
      case Fact::kSkipReceivedF:
        return {what, to_string(producer_of(need)),
                from_rank("it receives the skip connection's input from rank ", need.peer)};
      case Fact::kSkipReceivedB:
        return {what, to_string(producer_of(need)),
                from_rank("it receives the skip connection's gradient from rank ", need.peer)};
      default:
        PPTRAIN_UNREACHABLE(to_string(a), " cannot wait for a ", fact_name(need.fact),
                            " on its own rank");
    }
  }

  // The action that matches a communication action on the peer rank.
  // Every SEND has its RECV on the peer rank and vice versa.
  void check_matching() {
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const Action& a = list[i];
        if (!is_comm(a.op)) continue;
        const Action peer = comm_peer(a);
        if (!slot(peer).found()) {
          fail(
              r, i,
              "no matching " + to_string(peer) + " on rank " + std::to_string(rank_of_peer(s_, a)));
        }
      }
    }
  }

  // Runs the ranks as far as they go: `advance(r, pc, runnable)` moves rank r's position pc[r]
  // on until it blocks or ends, and pushes on `runnable` the ranks its progress may unblock.
  // Every rank starts runnable, rank 0 first. Returns where each rank stopped.
  template <typename Advance>
  std::vector<size_t> run_ranks(Advance advance) const {
    const int P = s_.num_ranks;
    std::vector<size_t> pc(P, 0);
    std::vector<int> runnable(P);
    for (int r = 0; r < P; ++r) runnable[r] = P - 1 - r;
    while (!runnable.empty()) {
      const int r = runnable.back();
      runnable.pop_back();
      advance(r, pc, runnable);
    }
    return pc;
  }

  // A schedule given with its messages: runs every rank's list in order, receives blocking until
  // their send has run, sends never blocking. Each rank runs until it blocks; a send wakes the
  // rank waiting for it, so the whole run is linear in the number of actions. If some rank
  // cannot finish, it is a deadlock.
  void check_deadlock() {
    const auto message = [&](const Action& comm) { return message_index(comm, s_); };
    std::vector<char> arrived(message_count(s_), 0);
    std::vector<int> waiter(arrived.size(), -1);
    const std::vector<size_t> pc =
        run_ranks([&](int r, std::vector<size_t>& at, std::vector<int>& runnable) {
          const auto& list = s_.actions[r];
          while (at[r] < list.size()) {
            const Action& a = list[at[r]];
            if (is_recv(a.op)) {
              const size_t m = message(a);
              if (!arrived[m]) {
                waiter[m] = r;
                break;
              }
            } else if (is_send(a.op)) {
              const size_t m = message(a);
              arrived[m] = 1;
              if (waiter[m] >= 0) runnable.push_back(waiter[m]);
              waiter[m] = -1;
            }
            ++at[r];
          }
        });
    fail_if_stuck(pc, [&](int r) {
      const Action send = comm_peer(s_.actions[r][pc[r]]);
      return to_string(send) + " on rank " +
             std::to_string(s_.rank_of(send.stage, send.microbatch));
    });
  }

  // A compute-only schedule: the deadlock check on the schedule lower() makes of it, without
  // making it. There a RECV sits right before the action that consumes it and its SEND right after
  // the action that produces it, so a rank waits exactly until every input it receives (in the
  // order lower() places their RECVs) has been produced on its rank; a send never blocks. Every
  // action reached has its inputs from its own rank checked as check_order() does.
  struct ComputeRun {
    std::vector<size_t> pc;     // where each rank stopped
    bool order_broken = false;  // an action reached waits for a later one of its rank
  };
  // The run asks only whether a fact has come true: a byte per fact, set as its action runs, not
  // where its producer sits in the table of positions. The byte of a backward's own forward,
  // about 2P microbatches back, is still in cache at P = 256 (3 MB for the whole table); its
  // position, in 32 bytes per (stage, microbatch), is not.
  ComputeRun run_compute_only() {
    ComputeRun run;
    FactTable<unsigned char> done(s_, 0, /*messages=*/false);
    // [rank] the ranks waiting for a fact one of its actions leaves: (that fact, waiting rank).
    std::vector<std::vector<std::pair<Need, int>>> waiters(s_.num_ranks);
    run.pc = run_ranks([&](int r, std::vector<size_t>& at, std::vector<int>& runnable) {
      const auto& list = s_.actions[r];
      const size_t from = at[r];
      for (; at[r] < list.size(); ++at[r]) {
        const Action& action = list[at[r]];
        const std::optional<Need> awaited =
            first_input_not_produced(action, r, done, run.order_broken);
        if (awaited) {
          waiters[s_.rank_of(awaited->stage, awaited->microbatch)].emplace_back(*awaited, r);
          break;
        }
        if (is_collective(action.op)) continue;  // a REDUCE_GRAD leaves no fact (semantics.h)
        for (const Action& atom : atoms_of(action)) done[produced_by(atom)] = 1;
      }
      if (at[r] == from) return;
      // Wake the ranks whose awaited fact rank r has now left; the others go on waiting.
      auto& mine = waiters[r];
      const auto still = std::partition(mine.begin(), mine.end(),
                                        [&](const auto& w) { return done[w.first] == 0; });
      for (auto it = still; it != mine.end(); ++it) runnable.push_back(it->second);
      mine.erase(still, mine.end());
    });
    return run;
  }
  bool any_stuck(const std::vector<size_t>& pc) const {
    for (int r = 0; r < s_.num_ranks; ++r) {
      if (pc[r] < s_.actions[r].size()) return true;
    }
    return false;
  }
  void fail_if_deadlocked_compute(const std::vector<size_t>& pc) {
    fail_if_stuck(pc, [&](int r) {
      const Need need = *first_receipt_not_produced(s_.actions[r][pc[r]], pc);
      const Action send = comm_peer(producer_of(need));
      const std::string what = is_skip_fact(need.fact) ? "its skip connection's " : "its ";
      const std::string awaited =
          send.op == Op::SEND_F
              ? what + "input from " + text_of(Op::F, send.stage, send.microbatch)
              : what + "output gradient from " + backward_text(send.stage, send.microbatch);
      return awaited + " on rank " + std::to_string(s_.rank_of(send.stage, send.microbatch));
    });
  }

  // The first input of `action` that lowering would make it receive (a Need of a receipt fact,
  // semantics.h) whose producer has not run yet, with ranks at positions `pc`; none if all have.
  std::optional<Need> first_receipt_not_produced(const Action& action,
                                                 const std::vector<size_t>& pc) {
    for (const Action& atom : atoms_of(action)) {
      for (const Need& need : inputs_of(atom, s_, /*lowered=*/true)) {
        if (!is_receipt(need.fact)) continue;
        // The action that leaves what the message carries (what its SEND waits for).
        const Action send = comm_peer(producer_of(need));
        const Where& producer = made_at(*inputs_of(send, s_.stage_to_rank, false).begin());
        if (pc[producer.rank] <= static_cast<size_t>(producer.position)) return need;
      }
    }
    return std::nullopt;
  }
  // An action of rank r that waits for one of its inputs from another rank, `done` marking the
  // facts left so far: the first such input; none when none is missing. Only the inputs of the
  // compute-only schedule: a skip message's comes from a stage whose output (or input gradient)
  // the stages in between pass on too, so it has been made when theirs has (which message the
  // deadlock message names, first_receipt_not_produced() says). An input made on rank r must be
  // made earlier in its list, or by an earlier part of the same composite; `order_broken` is set
  // when one is not.
  std::optional<Need> first_input_not_produced(const Action& action, int r,
                                               const FactTable<unsigned char>& done,
                                               bool& order_broken) {
    std::optional<Need> awaited;
    const Atoms parts = atoms_of(action);
    for (const Action* atom = parts.begin(); atom != parts.end(); ++atom) {
      for (const Need& need : inputs_of(*atom, s_.stage_to_rank, /*lowered=*/false)) {
        if (done[need]) continue;
        if (s_.rank_of(need.stage, need.microbatch) != r) {
          if (!awaited) awaited = need;
        } else if (std::none_of(parts.begin(), atom, [&](const Action& earlier) {
                     return produced_by(earlier) == need;
                   })) {
          order_broken = true;
        }
      }
    }
    return awaited;
  }
  // Fails with a deadlock if a rank has actions left at `pc`. `awaited(r)` says what rank r
  // waits for and where ("4F1 on rank 2").
  template <typename Awaited>
  void fail_if_stuck(const std::vector<size_t>& pc, Awaited awaited) {
    std::vector<int> stuck;
    for (int r = 0; r < s_.num_ranks; ++r) {
      if (pc[r] < s_.actions[r].size()) stuck.push_back(r);
    }
    if (stuck.empty()) return;
    std::string message_text = "deadlock: no rank can progress;";
    for (size_t k = 0; k < stuck.size() && k < kMaxStuckListed; ++k) {
      const int r = stuck[k];
      message_text += std::string(k ? "," : "") + " rank " + std::to_string(r) +
                      " waits at position " + std::to_string(pc[r]) + " (" +
                      to_string(s_.actions[r][pc[r]]) + ") for " + awaited(r);
    }
    if (stuck.size() > kMaxStuckListed) {
      message_text += ", and " + std::to_string(stuck.size() - kMaxStuckListed) + " more ranks";
    }
    fail(stuck[0], static_cast<int>(pc[stuck[0]]), message_text);
  }

  const Schedule& s_;
  int M_ = 0;
  bool with_comms_ = false;
  int ops_ = kAtomOps;       // ops recorded per (stage, microbatch): kComputeOps without messages
  std::vector<Where> seen_;  // [(stage * M + microbatch) * ops_ + op]
  // [skip * M + microbatch][SEND_F, RECV_F, SEND_B, RECV_B] of the skip messages
  std::vector<std::array<Where, 4>> skip_seen_;
  std::vector<Where> reductions_;  // [stage * P + rank] the stage's REDUCE_GRAD there, if any
};

}  // namespace

const Schedule& ValidatedSchedule::schedule() const {
  if (!lowering_) return given_;
  lowering_->once.call([this] { lowering_->lowered = lower(given_); });
  return lowering_->lowered;
}

ValidatedSchedule validate(Schedule schedule) {
  const bool with_comms = Validator(schedule).run();
  return ValidatedSchedule(std::move(schedule), /*compute_only=*/!with_comms);
}

}  // namespace pptrain
