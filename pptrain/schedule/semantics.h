// What a schedule's actions mean, defined once: the plain actions a composite stands for, what
// each action waits for and leaves behind, and which message a SEND or RECV carries. Lowering,
// the validator, the simulator, the generators and the executor all read the rules from here.
//
// Every action leaves one Fact behind, keyed by its own stage and microbatch:
//   F s m       kOutput     stage s's output for microbatch m (and the stash its backward needs)
//   I s m       kInputGrad  the gradient of stage s's input
//   B s m       kInputGrad  the same (B is I and W fused)
//   W s m       kWeightGrad stage s's weight gradients for microbatch m
//   SEND_F s m  kSentF      ...   SEND_B s m  kSentB
//   RECV_F s m  kReceivedF  ...   RECV_B s m  kReceivedB
// and a skip message's SEND or RECV (Action::peer = p) its own kSkip* fact, keyed by its stage,
// microbatch and peer: SEND_F s m >p kSkipSentF, RECV_F s m <p kSkipReceivedF, and so on.
// and waits for (inputs_of):
//   F s m       kOutput s-1 m, or kReceivedF s m when stage s-1 is on another rank (lowered)
//   I/B s m     kOutput s m, and kInputGrad s+1 m, or kReceivedB s m across ranks (lowered)
//   W s m       kInputGrad s m (its I)
//   SEND_F s m  kOutput s m            SEND_B s m  kInputGrad s m
//   RECV_F s m  kSentF s-1 m           RECV_B s m  kSentB s+1 m
// With skips (Schedule::skips), lowered, where the skip's two stages are on different ranks:
//   F t m       also kSkipReceivedF t m <s for each skip s -> t
//   I/B s m     also kSkipReceivedB s m <t for each skip s -> t
//   SEND_F s m >t  kOutput s m         SEND_B t m >s  kInputGrad t m
//   RECV_F t m <s  kSkipSentF s m >t   RECV_B s m <t  kSkipSentB t m >s
// On one rank, or before lowering, a skip adds nothing: F s m comes before F t m, and the
// backward of t before that of s, through the stages between.
// REDUCE_GRAD s (no microbatch) is the odd one out: it leaves no Fact that another action of the
// step waits for (the optimizer step after the flush waits for it), and it waits for the weight
// gradients of stage s for EVERY microbatch (each W or B of s), a range no Need expresses.
// inputs_of() gives it no needs and produced_by() refuses it; the validator orders it after the
// stage's last W or B on its rank (schedule/reductions.h inserts it there), and lowering leaves
// it where it is.
// In a compute-only schedule (not lowered) a compute action waits for the producer itself, on
// whatever rank it runs. Stage 0 has no input to wait for and the last stage no output gradient.
//
// "Another rank" is decided per microbatch: F s m is across from s-1 when rank_of(s-1, m) !=
// rank_of(s, m) (schedule.h), so in a replicated schedule the same boundary may need a message
// for one microbatch and not for another. The overloads taking a Schedule read its placement
// that way; those taking `stage_to_rank` place every microbatch of a stage on one rank.
//
//   for (const Action& atom : atoms_of(action))
//     for (const Need& need : inputs_of(atom, schedule, /*lowered=*/true)) ...
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pptrain/schedule/action.h"
#include "pptrain/schedule/schedule.h"

namespace pptrain {

enum class Fact : unsigned char {
  kOutput,
  kInputGrad,
  kWeightGrad,
  kSentF,
  kSentB,
  kReceivedF,
  kReceivedB,
  // A skip message's (Need::peer: the stage at its other end).
  kSkipSentF,
  kSkipSentB,
  kSkipReceivedF,
  kSkipReceivedB,
};
constexpr int kNumFacts = 11;
constexpr int kNumAdjacentFacts = 7;  // those before kSkipSentF: keyed by (stage, microbatch)
constexpr int kNumComputeFacts = 3;   // kOutput, kInputGrad, kWeightGrad: left by F, I, W, B
const char* fact_name(Fact fact);     // "output", "input gradient", ...
inline bool is_skip_fact(Fact fact) {
  return static_cast<int>(fact) >= kNumAdjacentFacts;
}
// A message sent (kSentF, kSentB and the skip ones) / received.
bool is_sent(Fact fact);
bool is_receipt(Fact fact);

// One fact about one (stage, microbatch), and for a skip message's the stage at the other end.
struct Need {
  Fact fact = Fact::kOutput;
  int stage = 0;
  int microbatch = 0;
  int peer = -1;
  bool operator==(const Need& other) const {
    return fact == other.fact && stage == other.stage && microbatch == other.microbatch &&
           peer == other.peer;
  }
};

// An atom's inputs: two at most, and one more per skip message it waits for. Iterate with a
// range-for.
class Needs {
 public:
  void push_back(const Need& need) {
    if (size_ < items_.size()) {
      // Field by field: a copy of the whole made on the stack reads back what was just written
      // in narrower stores, which the processor cannot forward (a stall on every call).
      Need& item = items_[size_++];
      item.fact = need.fact;
      item.stage = need.stage;
      item.microbatch = need.microbatch;
      item.peer = need.peer;
      return;
    }
    if (more_.empty()) more_.assign(items_.begin(), items_.end());
    more_.push_back(need);
    ++size_;
  }
  const Need* begin() const { return more_.empty() ? items_.data() : more_.data(); }
  const Need* end() const { return begin() + size_; }
  size_t size() const { return size_; }

 private:
  std::array<Need, 3> items_{};
  std::vector<Need> more_;  // all of them, once there are more than items_ holds
  size_t size_ = 0;
};

namespace detail {
Need produced_by_message(const Action& atom);  // produced_by() of anything but F, I, W, B
}  // namespace detail
// The fact an atom (not a composite, not a REDUCE_GRAD) leaves behind. (Inline for the compute
// atoms: the generators and the simulator ask it for every one.)
inline Need produced_by(const Action& atom) {
  switch (atom.op) {
    case Op::F:
      return {Fact::kOutput, atom.stage, atom.microbatch};
    case Op::I:
    case Op::B:
      return {Fact::kInputGrad, atom.stage, atom.microbatch};
    case Op::W:
      return {Fact::kWeightGrad, atom.stage, atom.microbatch};
    default:
      return detail::produced_by_message(atom);
  }
}
// True for the atoms that complete a stage's weight gradients for one microbatch (W, or a fused
// B): what a REDUCE_GRAD of that stage waits for.
bool computes_weight_grads(Op op);
// The atom that produces `need`'s fact. For kInputGrad that is an I (a schedule may have a B
// there instead; both produce it).
Action producer_of(const Need& need);
namespace detail {
[[noreturn]] void refuse_composite_inputs(const Action& atom);

// What a compute atom (F, I, W, B) waits for before lowering: the producers themselves,
// wherever they run. Small enough to inline where the generators, the validator and the
// simulator ask it for every action.
inline Needs compute_inputs(const Action& atom, int num_stages) {
  const int s = atom.stage, m = atom.microbatch;
  Needs needs;
  switch (atom.op) {
    case Op::F:
      if (s > 0) needs.push_back({Fact::kOutput, s - 1, m});
      break;
    case Op::I:
    case Op::B:
      needs.push_back({Fact::kOutput, s, m});
      if (s < num_stages - 1) needs.push_back({Fact::kInputGrad, s + 1, m});
      break;
    case Op::W:
      needs.push_back({Fact::kInputGrad, s, m});
      break;
    default:
      refuse_composite_inputs(atom);  // (callers route the others to inputs_with)
  }
  return needs;
}

// inputs_of for any placement: `rank(stage)` is the rank that runs `stage` for the atom's
// microbatch. Lowered, a compute atom's inputs from another rank arrive as messages: the
// output of stage s-1 as kReceivedF s, the input gradient of stage s+1 as kReceivedB s, and a
// skip's as its kSkipReceived* fact.
template <typename RankOf>
Needs inputs_with(const Action& atom, int num_stages, const SkipLink* skips_begin,
                  const SkipLink* skips_end, RankOf rank, bool lowered) {
  const int s = atom.stage, m = atom.microbatch;
  Needs needs;
  switch (atom.op) {
    case Op::F:
    case Op::I:
    case Op::B:
    case Op::W:
      for (const Need& need : compute_inputs(atom, num_stages)) {
        const bool across = lowered && need.stage != s && rank(need.stage) != rank(s);
        if (!across) {
          needs.push_back(need);
        } else {
          needs.push_back({atom.op == Op::F ? Fact::kReceivedF : Fact::kReceivedB, s, m});
        }
      }
      if (!lowered || atom.op == Op::W) break;
      for (const SkipLink* skip = skips_begin; skip != skips_end; ++skip) {
        if (atom.op == Op::F && skip->to == s && rank(skip->from) != rank(s))
          needs.push_back({Fact::kSkipReceivedF, s, m, skip->from});
        if (atom.op != Op::F && skip->from == s && rank(skip->to) != rank(s))
          needs.push_back({Fact::kSkipReceivedB, s, m, skip->to});
      }
      break;
    case Op::SEND_F:  // a skip message's too
      needs.push_back({Fact::kOutput, s, m});
      break;
    case Op::SEND_B:
      needs.push_back({Fact::kInputGrad, s, m});
      break;
    case Op::RECV_F:
      if (is_skip_message(atom)) {
        needs.push_back({Fact::kSkipSentF, atom.peer, m, s});
      } else {
        needs.push_back({Fact::kSentF, s - 1, m});
      }
      break;
    case Op::RECV_B:
      if (is_skip_message(atom)) {
        needs.push_back({Fact::kSkipSentB, atom.peer, m, s});
      } else {
        needs.push_back({Fact::kSentB, s + 1, m});
      }
      break;
    case Op::REDUCE_GRAD:
      break;  // every W or B of its stage: not a Need (see above)
    case Op::OVERLAP_F_B:
      refuse_composite_inputs(atom);
  }
  return needs;
}
}  // namespace detail

// What `atom` waits for (see the table above). `stage_to_rank` places the stages; `lowered`
// says whether inputs from other ranks arrive through RECV actions. None for a REDUCE_GRAD (see
// above).
inline Needs inputs_of(const Action& atom, const std::vector<int>& stage_to_rank, bool lowered) {
  const int stages = static_cast<int>(stage_to_rank.size());
  if (!lowered && atom.op <= Op::B) return detail::compute_inputs(atom, stages);  // F, I, W, B
  return detail::inputs_with(
      atom, stages, nullptr, nullptr, [&](int stage) { return stage_to_rank[stage]; }, lowered);
}
// The same, with "another rank" decided by schedule.rank_of(stage, atom's microbatch).
inline Needs inputs_of(const Action& atom, const Schedule& schedule, bool lowered) {
  // Only a lowered schedule asks where stages run (and a REDUCE_GRAD has no microbatch).
  if (!lowered || atom.op == Op::REDUCE_GRAD) return inputs_of(atom, schedule.stage_to_rank, false);
  return detail::inputs_with(
      atom, schedule.num_stages, schedule.skips.data(),
      schedule.skips.data() + schedule.skips.size(),
      [&](int stage) { return schedule.rank_of(stage, atom.microbatch); }, lowered);
}

// The SEND that must follow `atom` in a lowered schedule because what it produced is consumed on
// another rank: SEND_F after an F whose next stage lives elsewhere, SEND_B after an I or B whose
// previous stage does. None for anything else.
std::optional<Action> send_after(const Action& atom, const std::vector<int>& stage_to_rank);
// Appends to `sends` every SEND that must follow `atom`, with the ranks of its microbatch
// (schedule.rank_of): the one above, then the skip messages (Schedule::skips) of an F to later
// stages and of an I or B back to earlier ones that run elsewhere. Appends, so that lowering
// makes no list per atom.
void append_sends_after(const Action& atom, const Schedule& schedule, std::vector<Action>& sends);

// One message between adjacent stages: the activation (forward) or its gradient (backward)
// crossing boundary b, the cut between stages b and b+1, for one microbatch. A SEND and the RECV
// at the other end carry the same message.
struct Message {
  bool backward = false;
  int boundary = 0;
  int microbatch = 0;
  bool operator==(const Message& other) const {
    return backward == other.backward && boundary == other.boundary &&
           microbatch == other.microbatch;
  }
};
namespace detail {
[[noreturn]] void refuse_message_of(const Action& action);
size_t skip_message_index(const Action& comm, const Schedule& schedule);
}  // namespace detail
// InternalError for a compute action, a REDUCE_GRAD or a skip message. (Inline, as the
// numbering below: the memory model and the executor ask them for every message.)
inline Message message_of(const Action& comm) {
  if (comm.peer < 0) {  // not a skip message
    switch (comm.op) {
      case Op::SEND_F:
        return {false, comm.stage, comm.microbatch};
      case Op::RECV_F:
        return {false, comm.stage - 1, comm.microbatch};
      case Op::SEND_B:
        return {true, comm.stage - 1, comm.microbatch};
      case Op::RECV_B:
        return {true, comm.stage, comm.microbatch};
      default:
        break;
    }
  }
  detail::refuse_message_of(comm);
}
// The other end of a communication action: RECV_F s+1 m for SEND_F s m, SEND_F s-1 m for
// RECV_F s m, RECV_B s-1 m for SEND_B s m, SEND_B s+1 m for RECV_B s m; RECV_F t m <s for
// SEND_F s m >t and the like for a skip message.
Action comm_peer(const Action& comm);
// The rank at the other end of a communication action: where comm_peer(comm) runs,
// schedule.rank_of(peer stage, microbatch). In a replicated schedule that depends on the
// microbatch; use this rather than stage_to_rank[comm_peer(comm).stage].
int rank_of_peer(const Schedule& schedule, const Action& comm);
// A dense number for a message between adjacent stages, 0 .. message_count(...) - 1, the same on
// every rank.
inline size_t message_index(const Message& message, int num_stages, int num_microbatches) {
  const size_t boundaries = num_stages > 1 ? static_cast<size_t>(num_stages - 1) : 1;
  return ((message.backward ? boundaries : 0) + static_cast<size_t>(message.boundary)) *
             static_cast<size_t>(num_microbatches) +
         static_cast<size_t>(message.microbatch);
}
size_t message_count(int num_stages, int num_microbatches);
// The same for any SEND or RECV of `schedule`, skip messages included (numbered after the
// others), 0 .. message_count(schedule) - 1.
inline size_t message_index(const Action& comm, const Schedule& schedule) {
  if (is_skip_message(comm)) return detail::skip_message_index(comm, schedule);
  return message_index(message_of(comm), schedule.num_stages, schedule.num_microbatches);
}
size_t message_count(const Schedule& schedule);

// When a rank lets go of what it sent (the runtime's rule, runtime/executor.h): a SEND at
// position p of `rank`'s list is waited on after the first later RECV of that rank from the
// same peer rank whose SEND there comes after the peer's RECV of the message p sent (so the peer
// has posted it); sends with no such RECV, at the end of the step. Returns, by position of such
// a RECV, the positions of the sends waited on after it. `lowered`: with its SEND and RECV
// actions, every message matched.
std::map<size_t, std::vector<size_t>> send_releases(const Schedule& lowered, int rank);
// The same for every rank as (RECV position, SEND position) pairs, in the order of the RECVs
// and, for one RECV, of the SENDs: [num_ranks][pair].
std::vector<std::vector<std::pair<size_t, size_t>>> send_release_pairs(const Schedule& lowered);

// Where the two ends of each message of a lowered schedule run: [message_index()] its rank
// (-1: none) and position there.
struct MessageEnds {
  struct End {
    int rank = -1;
    size_t position = 0;
  };
  std::vector<End> sent_at, received_at;
  explicit MessageEnds(const Schedule& lowered);
};

// The rule of send_releases() for one rank, applied down its list one message at a time (the
// memory model's walk does it in its own pass).
class SendReleases {
 public:
  // A SEND of this rank at `position` (or any number that grows down the list: received() hands
  // it back), whose message rank `peer` receives at `received` there.
  void sent(int peer, size_t received, size_t position);
  // A RECV of this rank from rank `peer`, whose SEND runs at `sent` there: appends to `released`
  // the positions of the sends it lets go, in their order.
  void received(int peer, size_t sent, std::vector<size_t>& released);

 private:
  struct Waiting {
    size_t received;  // where the peer receives the message
    size_t position;  // of the send here
    bool operator<(const Waiting& other) const { return received > other.received; }
  };
  struct Peer {
    int rank;
    std::vector<Waiting> sends;  // a heap, the earliest received on top
  };
  std::vector<Peer> peers_;  // the few ranks this one sends to
};

// How many of the receives of a rank's list `actions` are posted before the action at each
// position runs (the runtime's rule): every receive up to that position, and the next
// `recv_ahead` after the ones consumed before it (-1: all of them at once). [actions.size()]
std::vector<size_t> receives_posted(const std::vector<Action>& actions, int recv_ahead);
// The same rule one position at a time, for a list with `receives` receives in all.
class ReceivesPosted {
 public:
  ReceivesPosted(size_t receives, int recv_ahead) : total_(receives), ahead_(recv_ahead) {}
  // How many receives are posted before the list's next action runs, `receive` saying whether
  // that action is one; called once per action, in order.
  size_t next(bool receive) {
    const size_t through = consumed_ + (receive ? 1 : 0);
    const size_t ahead = ahead_ < 0 ? total_ : consumed_ + static_cast<size_t>(ahead_);
    posted_ = std::min(total_, std::max({posted_, through, ahead}));
    consumed_ = through;
    return posted_;
  }

 private:
  size_t total_;
  int ahead_;
  size_t consumed_ = 0, posted_ = 0;  // receives before the position; posted so far
};

// An asynchronous schedule is one list over the whole run, its microbatches numbered across
// steps of `microbatches_per_step`. Step k's segment of a rank's list ends after the rank's last
// action on a microbatch of steps 0..k (so it may hold later steps' actions too); the last
// segment ends at the list's end. Returns the end (exclusive) of each step's segment on `rank`.
std::vector<size_t> step_segment_ends(const Schedule& schedule, int rank,
                                      int microbatches_per_step);
// The first step k (0-based) whose segment ends do not form a cut that messages cross forwards
// only: some rank receives in its segments 0..k a message its peer sends after its own segment
// k. -1 when there is none, so that after any step every rank can stop (to save a checkpoint)
// without waiting for another's later work, and what crosses the cut is only messages sent and
// not yet received. `lowered`: with its SEND and RECV actions.
int first_crossed_step(const Schedule& lowered, int microbatches_per_step);
// The step segment (step_segment_ends) in which each message is sent and received, indexed by
// message_index(); -1 for an index no action uses. `lowered`: with its SEND and RECV actions.
struct MessageSegments {
  std::vector<int> sent_in;
  std::vector<int> received_in;
};
MessageSegments message_segments(const Schedule& lowered, int microbatches_per_step);

// A dense table of one value per (fact, stage, microbatch), for whoever tracks facts: positions
// (validator), times (simulator), steps (generators). The skip facts have a place only in a
// table made for a schedule with skips; a table of the compute facts only (kNumComputeFacts)
// has none for the messages' facts either.
template <typename T>
class FactTable {
 public:
  // The compute facts of a compute-only schedule (what its actions wait for and leave behind).
  FactTable(int num_stages, int num_microbatches, T initial)
      : stages_(num_stages),
        microbatches_(num_microbatches),
        values_(static_cast<size_t>(kNumComputeFacts) * num_stages * num_microbatches, initial) {}
  // Every fact of `schedule`: its messages' and skip messages' too, or (`messages` false) the
  // compute facts alone.
  FactTable(const Schedule& schedule, T initial, bool messages = true)
      : stages_(schedule.num_stages),
        microbatches_(schedule.num_microbatches),
        skips_(messages ? schedule.skips : std::vector<SkipLink>{}),
        values_(messages ? (static_cast<size_t>(kNumAdjacentFacts) * schedule.num_stages +
                            (kNumFacts - kNumAdjacentFacts) * schedule.skips.size()) *
                               schedule.num_microbatches
                         : static_cast<size_t>(kNumComputeFacts) * schedule.num_stages *
                               schedule.num_microbatches,
                initial) {}
  T& operator[](const Need& need) { return values_[index(need)]; }
  const T& operator[](const Need& need) const { return values_[index(need)]; }

 private:
  size_t index(const Need& need) const {
    if (!is_skip_fact(need.fact)) {
      const size_t i =
          (static_cast<size_t>(need.fact) * stages_ + need.stage) * microbatches_ + need.microbatch;
      assert(i < values_.size() && "a fact the table has no place for");
      return i;
    }
    const SkipLink link{std::min(need.stage, need.peer), std::max(need.stage, need.peer)};
    const size_t k =
        static_cast<size_t>(std::lower_bound(skips_.begin(), skips_.end(), link) - skips_.begin());
    const size_t kind = static_cast<size_t>(need.fact) - kNumAdjacentFacts;
    return ((static_cast<size_t>(kNumAdjacentFacts) * stages_ + kind * skips_.size() + k) *
            microbatches_) +
           need.microbatch;
  }
  int stages_;
  int microbatches_;
  std::vector<SkipLink> skips_;
  std::vector<T> values_;
};

// Insert SEND/RECV actions into a compute-only schedule wherever stage s and s+1 of a microbatch
// m live on different ranks (rank_of(s, m) != rank_of(s+1, m)), and for each skip whose two
// stages do: a send right after the action that produces the tensor, a receive right before the
// action that consumes it. Sends never block
// (the runtime waits on them lazily), so if the compute order is free of cross-rank cycles, the
// lowered schedule cannot deadlock; the validator checks that. A schedule that already has
// communication actions is returned as is.
Schedule lower(const Schedule& schedule);

}  // namespace pptrain
