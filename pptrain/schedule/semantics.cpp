#include "pptrain/schedule/semantics.h"

#include <algorithm>

#include "pptrain/common/check.h"

namespace pptrain {

const char* fact_name(Fact fact) {
  switch (fact) {
    case Fact::kOutput:
      return "output";
    case Fact::kInputGrad:
      return "input gradient";
    case Fact::kWeightGrad:
      return "weight gradients";
    case Fact::kSentF:
      return "sent activation";
    case Fact::kSentB:
      return "sent gradient";
    case Fact::kReceivedF:
      return "received activation";
    case Fact::kReceivedB:
      return "received gradient";
    case Fact::kSkipSentF:
      return "sent skip activation";
    case Fact::kSkipSentB:
      return "sent skip gradient";
    case Fact::kSkipReceivedF:
      return "received skip activation";
    case Fact::kSkipReceivedB:
      return "received skip gradient";
  }
  PPTRAIN_UNREACHABLE("unknown fact");
}

bool is_sent(Fact fact) {
  return fact == Fact::kSentF || fact == Fact::kSentB || fact == Fact::kSkipSentF ||
         fact == Fact::kSkipSentB;
}

bool is_receipt(Fact fact) {
  return fact == Fact::kReceivedF || fact == Fact::kReceivedB || fact == Fact::kSkipReceivedF ||
         fact == Fact::kSkipReceivedB;
}

namespace detail {

Need produced_by_message(const Action& atom) {
  const int s = atom.stage, m = atom.microbatch;
  if (is_skip_message(atom)) {
    static constexpr Fact kSkipFact[] = {Fact::kSkipSentF, Fact::kSkipReceivedF, Fact::kSkipSentB,
                                         Fact::kSkipReceivedB};
    return {kSkipFact[static_cast<int>(atom.op) - static_cast<int>(Op::SEND_F)], s, m, atom.peer};
  }
  switch (atom.op) {
    case Op::F:
    case Op::I:
    case Op::B:
    case Op::W:
      return produced_by(atom);  // answered inline (semantics.h)
    case Op::SEND_F:
      return {Fact::kSentF, s, m};
    case Op::SEND_B:
      return {Fact::kSentB, s, m};
    case Op::RECV_F:
      return {Fact::kReceivedF, s, m};
    case Op::RECV_B:
      return {Fact::kReceivedB, s, m};
    case Op::OVERLAP_F_B:
      break;
    case Op::REDUCE_GRAD:
      PPTRAIN_UNREACHABLE("a reduction leaves no per-microbatch fact: ", to_string(atom));
  }
  PPTRAIN_UNREACHABLE("a composite produces its parts' facts, not one: ", to_string(atom));
}

}  // namespace detail

bool computes_weight_grads(Op op) {
  return op == Op::W || op == Op::B;
}

Action producer_of(const Need& need) {
  static constexpr Op kProducer[kNumFacts] = {Op::F,      Op::I,      Op::W,      Op::SEND_F,
                                              Op::SEND_B, Op::RECV_F, Op::RECV_B, Op::SEND_F,
                                              Op::SEND_B, Op::RECV_F, Op::RECV_B};
  const Op op = kProducer[static_cast<int>(need.fact)];
  if (is_skip_fact(need.fact)) return Action::skip(op, need.stage, need.microbatch, need.peer);
  return Action::make(op, need.stage, need.microbatch);
}

namespace {

// send_after for any placement: `rank(stage)` is the rank that runs `stage` for the atom's
// microbatch.
template <typename RankOf>
std::optional<Action> send_after_with(const Action& atom, int num_stages, RankOf rank) {
  const int s = atom.stage, last = num_stages - 1;
  const auto elsewhere = [&](int other) { return rank(other) != rank(s); };
  if (atom.op == Op::F && s < last && elsewhere(s + 1)) {
    return Action::make(Op::SEND_F, s, atom.microbatch);
  }
  if (is_backward(atom.op) && s > 0 && elsewhere(s - 1)) {
    return Action::make(Op::SEND_B, s, atom.microbatch);
  }
  return std::nullopt;
}

}  // namespace

namespace detail {

void refuse_composite_inputs(const Action& atom) {
  PPTRAIN_UNREACHABLE("inputs_of takes one atom, not a composite: ", to_string(atom));
}

}  // namespace detail

std::optional<Action> send_after(const Action& atom, const std::vector<int>& stage_to_rank) {
  return send_after_with(atom, static_cast<int>(stage_to_rank.size()),
                         [&](int stage) { return stage_to_rank[stage]; });
}

void append_sends_after(const Action& atom, const Schedule& schedule, std::vector<Action>& sends) {
  if (atom.op != Op::F && !is_backward(atom.op)) return;
  const int m = atom.microbatch;
  const auto rank = [&](int stage) { return schedule.rank_of(stage, m); };
  // Each written in place (action.h: Action's constructor).
  if (const auto send = send_after_with(atom, schedule.num_stages, rank)) {
    sends.emplace_back(send->op, send->stage, send->microbatch);
  }
  for (const SkipLink& skip : schedule.skips) {
    if (rank(skip.from) == rank(skip.to)) continue;
    if (atom.op == Op::F && skip.from == atom.stage)
      sends.emplace_back(Op::SEND_F, skip.from, m, skip.to);
    if (atom.op != Op::F && skip.to == atom.stage)
      sends.emplace_back(Op::SEND_B, skip.to, m, skip.from);
  }
}

namespace detail {

void refuse_message_of(const Action& action) {
  PPTRAIN_ASSERT(!is_skip_message(action),
                 "message_of() takes a message between adjacent stages, not ", to_string(action));
  PPTRAIN_UNREACHABLE("not a communication action: ", to_string(action));
}

size_t skip_message_index(const Action& comm, const Schedule& schedule) {
  const int M = schedule.num_microbatches;
  const int k = schedule.skip_index(comm.stage, comm.peer);
  PPTRAIN_ASSERT(k >= 0, to_string(comm), " is not a message of one of the schedule's skips");
  const bool backward = comm.op == Op::SEND_B || comm.op == Op::RECV_B;
  return message_count(schedule.num_stages, M) +
         (static_cast<size_t>(k) * static_cast<size_t>(M) + static_cast<size_t>(comm.microbatch)) *
             2 +
         (backward ? 1 : 0);
}

}  // namespace detail

size_t message_count(int num_stages, int num_microbatches) {
  const size_t boundaries = num_stages > 1 ? static_cast<size_t>(num_stages - 1) : 1;
  return 2 * boundaries * static_cast<size_t>(num_microbatches);
}

size_t message_count(const Schedule& schedule) {
  return message_count(schedule.num_stages, schedule.num_microbatches) +
         2 * schedule.skips.size() * static_cast<size_t>(schedule.num_microbatches);
}

MessageEnds::MessageEnds(const Schedule& lowered)
    : sent_at(message_count(lowered)), received_at(message_count(lowered)) {
  for (int r = 0; r < lowered.num_ranks; ++r) {
    for (size_t p = 0; p < lowered.actions[r].size(); ++p) {
      const Action& a = lowered.actions[r][p];
      if (is_send(a.op)) sent_at[message_index(a, lowered)] = {r, p};
      if (is_recv(a.op)) received_at[message_index(a, lowered)] = {r, p};
    }
  }
}

// Each send waits among the others to its peer rank until a receive from that peer whose send
// there comes after the peer's receive of it; the first such receive lets it go.
void SendReleases::sent(int peer, size_t received, size_t position) {
  auto it =
      std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) { return p.rank == peer; });
  if (it == peers_.end()) it = peers_.insert(peers_.end(), Peer{peer, {}});
  it->sends.push_back({received, position});
  std::push_heap(it->sends.begin(), it->sends.end());
}

void SendReleases::received(int peer, size_t sent, std::vector<size_t>& released) {
  const auto it =
      std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) { return p.rank == peer; });
  if (it == peers_.end()) return;
  const size_t first = released.size();
  std::vector<Waiting>& sends = it->sends;
  while (!sends.empty() && sends.front().received < sent) {
    released.push_back(sends.front().position);
    std::pop_heap(sends.begin(), sends.end());
    sends.pop_back();
  }
  std::sort(released.begin() + static_cast<std::ptrdiff_t>(first), released.end());
}

namespace {

// Rank `rank`'s (RECV position, SEND position) pairs of send_releases(), in the order of the
// RECVs and, for one RECV, of the SENDs: SendReleases down its list.
std::vector<std::pair<size_t, size_t>> releases_of(const Schedule& lowered, int rank,
                                                   const MessageEnds& ends) {
  const auto& mine = lowered.actions[rank];
  SendReleases releases;
  std::vector<size_t> released;
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t p = 0; p < mine.size(); ++p) {
    const Action& a = mine[p];
    if (is_send(a.op)) {
      const MessageEnds::End& receive = ends.received_at[message_index(a, lowered)];
      PPTRAIN_ASSERT(receive.rank >= 0, to_string(a), " has no matching receive");
      releases.sent(receive.rank, receive.position, p);
    } else if (is_recv(a.op)) {
      const MessageEnds::End& send = ends.sent_at[message_index(a, lowered)];
      released.clear();
      releases.received(send.rank, send.position, released);
      for (size_t q : released) out.emplace_back(p, q);
    }
  }
  return out;
}

}  // namespace

std::map<size_t, std::vector<size_t>> send_releases(const Schedule& lowered, int rank) {
  std::map<size_t, std::vector<size_t>> out;
  for (const auto& [recv, send] : releases_of(lowered, rank, MessageEnds(lowered))) {
    out[recv].push_back(send);
  }
  return out;
}

std::vector<std::vector<std::pair<size_t, size_t>>> send_release_pairs(const Schedule& lowered) {
  const MessageEnds ends(lowered);
  std::vector<std::vector<std::pair<size_t, size_t>>> out;
  for (int r = 0; r < lowered.num_ranks; ++r) {
    out.push_back(releases_of(lowered, r, ends));
  }
  return out;
}

std::vector<size_t> receives_posted(const std::vector<Action>& actions, int recv_ahead) {
  size_t total = 0;
  for (const Action& a : actions) total += is_recv(a.op) ? 1 : 0;
  ReceivesPosted posted(total, recv_ahead);
  std::vector<size_t> out(actions.size());
  for (size_t p = 0; p < actions.size(); ++p) out[p] = posted.next(is_recv(actions[p].op));
  return out;
}

std::vector<size_t> step_segment_ends(const Schedule& schedule, int rank,
                                      int microbatches_per_step) {
  PPTRAIN_ASSERT(microbatches_per_step > 0 &&
                 schedule.num_microbatches % microbatches_per_step == 0);
  const auto& mine = schedule.actions[rank];
  std::vector<size_t> ends(schedule.num_microbatches / microbatches_per_step, 0);
  for (size_t p = 0; p < mine.size(); ++p) {
    for (const Action& atom : atoms_of(mine[p])) {
      size_t& end = ends[atom.microbatch / microbatches_per_step];
      end = std::max(end, p + 1);
    }
  }
  ends.back() = mine.size();
  for (size_t k = 1; k < ends.size(); ++k) ends[k] = std::max(ends[k], ends[k - 1]);
  return ends;
}

MessageSegments message_segments(const Schedule& lowered, int microbatches_per_step) {
  const size_t count = message_count(lowered);
  MessageSegments out{std::vector<int>(count, -1), std::vector<int>(count, -1)};
  for (int r = 0; r < lowered.num_ranks; ++r) {
    const std::vector<size_t> ends = step_segment_ends(lowered, r, microbatches_per_step);
    int segment = 0;
    for (size_t p = 0; p < lowered.actions[r].size(); ++p) {
      while (p >= ends[segment]) ++segment;
      const Action& a = lowered.actions[r][p];
      if (!is_comm(a.op)) continue;
      const size_t index = message_index(a, lowered);
      (is_send(a.op) ? out.sent_in : out.received_in)[index] = segment;
    }
  }
  return out;
}

int first_crossed_step(const Schedule& lowered, int microbatches_per_step) {
  const auto [sent_in, received_in] = message_segments(lowered, microbatches_per_step);
  const size_t count = sent_in.size();
  int first = -1;
  for (size_t i = 0; i < count; ++i) {
    // Received in segment j but sent in a later segment k: the cuts after steps j..k-1 are
    // crossed backwards.
    if (sent_in[i] > received_in[i] && received_in[i] >= 0 &&
        (first < 0 || received_in[i] < first)) {
      first = received_in[i];
    }
  }
  return first;
}

Action comm_peer(const Action& a) {
  if (is_skip_message(a)) {
    static constexpr Op kOther[] = {Op::RECV_F, Op::SEND_F, Op::RECV_B, Op::SEND_B};
    return Action::skip(kOther[static_cast<int>(a.op) - static_cast<int>(Op::SEND_F)], a.peer,
                        a.microbatch, a.stage);
  }
  const Message m = message_of(a);
  switch (a.op) {
    case Op::SEND_F:
      return Action::make(Op::RECV_F, m.boundary + 1, m.microbatch);
    case Op::RECV_F:
      return Action::make(Op::SEND_F, m.boundary, m.microbatch);
    case Op::SEND_B:
      return Action::make(Op::RECV_B, m.boundary, m.microbatch);
    default:  // RECV_B
      return Action::make(Op::SEND_B, m.boundary + 1, m.microbatch);
  }
}

int rank_of_peer(const Schedule& schedule, const Action& comm) {
  const Action peer = comm_peer(comm);
  return schedule.rank_of(peer.stage, peer.microbatch);
}

Schedule lower(const Schedule& schedule) {
  if (schedule.has_comms()) return schedule;
  Schedule out = without_actions(schedule);
  for (int r = 0; r < schedule.num_ranks; ++r) {
    std::vector<Action>& lowered = out.actions[r];
    // A receive before and a send after each compute action at most, but for skip messages: what
    // is reserved and never written takes no memory.
    lowered.reserve(3 * schedule.actions[r].size() + 16);
    for (const Action& a : schedule.actions[r]) {
      // Receives first: everything the (possibly composite) action consumes from other ranks.
      for (const Action& atom : atoms_of(a)) {
        for (const Need& need : inputs_of(atom, schedule, /*lowered=*/true)) {
          if (is_receipt(need.fact)) {
            const Action recv = producer_of(need);
            lowered.emplace_back(recv.op, recv.stage, recv.microbatch, recv.peer);  // in place
          }
        }
      }
      lowered.push_back(a);
      for (const Action& atom : atoms_of(a)) {
        append_sends_after(atom, schedule, lowered);
      }
    }
  }
  return out;
}

}  // namespace pptrain
