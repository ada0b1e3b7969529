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
  }
  PPTRAIN_UNREACHABLE("unknown fact");
}

Need produced_by(const Action& atom) {
  const int s = atom.stage, m = atom.microbatch;
  switch (atom.op) {
    case Op::F:
      return {Fact::kOutput, s, m};
    case Op::I:
    case Op::B:
      return {Fact::kInputGrad, s, m};
    case Op::W:
      return {Fact::kWeightGrad, s, m};
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

bool computes_weight_grads(Op op) {
  return op == Op::W || op == Op::B;
}

Action producer_of(const Need& need) {
  static constexpr Op kProducer[kNumFacts] = {Op::F,      Op::I,      Op::W,     Op::SEND_F,
                                              Op::SEND_B, Op::RECV_F, Op::RECV_B};
  return Action::make(kProducer[static_cast<int>(need.fact)], need.stage, need.microbatch);
}

namespace {

// inputs_of and send_after for any placement: `rank(stage)` is the rank that runs `stage` for the
// atom's microbatch.
template <typename RankOf>
Needs inputs_with(const Action& atom, int num_stages, RankOf rank, bool lowered) {
  const int s = atom.stage, m = atom.microbatch;
  const int last = num_stages - 1;
  const auto across = [&](int other) { return lowered && rank(other) != rank(s); };
  Needs needs;
  switch (atom.op) {
    case Op::F:
      if (s > 0)
        needs.push_back(across(s - 1) ? Need{Fact::kReceivedF, s, m}
                                      : Need{Fact::kOutput, s - 1, m});
      break;
    case Op::I:
    case Op::B:
      needs.push_back({Fact::kOutput, s, m});
      if (s < last)
        needs.push_back(across(s + 1) ? Need{Fact::kReceivedB, s, m}
                                      : Need{Fact::kInputGrad, s + 1, m});
      break;
    case Op::W:
      needs.push_back({Fact::kInputGrad, s, m});
      break;
    case Op::SEND_F:
      needs.push_back({Fact::kOutput, s, m});
      break;
    case Op::SEND_B:
      needs.push_back({Fact::kInputGrad, s, m});
      break;
    case Op::RECV_F:
      needs.push_back({Fact::kSentF, s - 1, m});
      break;
    case Op::RECV_B:
      needs.push_back({Fact::kSentB, s + 1, m});
      break;
    case Op::REDUCE_GRAD:
      break;  // every W or B of its stage: not a Need (see semantics.h)
    case Op::OVERLAP_F_B:
      PPTRAIN_UNREACHABLE("inputs_of takes one atom, not a composite: ", to_string(atom));
  }
  return needs;
}

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

Needs inputs_of(const Action& atom, const std::vector<int>& stage_to_rank, bool lowered) {
  return inputs_with(
      atom, static_cast<int>(stage_to_rank.size()), [&](int stage) { return stage_to_rank[stage]; },
      lowered);
}

Needs inputs_of(const Action& atom, const Schedule& schedule, bool lowered) {
  // Only a lowered schedule asks where stages run (and a REDUCE_GRAD has no microbatch).
  if (!lowered || atom.op == Op::REDUCE_GRAD) return inputs_of(atom, schedule.stage_to_rank, false);
  return inputs_with(
      atom, schedule.num_stages,
      [&](int stage) { return schedule.rank_of(stage, atom.microbatch); }, lowered);
}

std::optional<Action> send_after(const Action& atom, const std::vector<int>& stage_to_rank) {
  return send_after_with(atom, static_cast<int>(stage_to_rank.size()),
                         [&](int stage) { return stage_to_rank[stage]; });
}

std::optional<Action> send_after(const Action& atom, const Schedule& schedule) {
  if (atom.op != Op::F && !is_backward(atom.op)) return std::nullopt;
  return send_after_with(atom, schedule.num_stages,
                         [&](int stage) { return schedule.rank_of(stage, atom.microbatch); });
}

Message message_of(const Action& a) {
  switch (a.op) {
    case Op::SEND_F:
      return {false, a.stage, a.microbatch};
    case Op::RECV_F:
      return {false, a.stage - 1, a.microbatch};
    case Op::SEND_B:
      return {true, a.stage - 1, a.microbatch};
    case Op::RECV_B:
      return {true, a.stage, a.microbatch};
    default:
      PPTRAIN_UNREACHABLE("not a communication action: ", to_string(a));
  }
}

size_t message_index(const Message& message, int num_stages, int num_microbatches) {
  const size_t boundaries = num_stages > 1 ? static_cast<size_t>(num_stages - 1) : 1;
  return ((message.backward ? boundaries : 0) + static_cast<size_t>(message.boundary)) *
             static_cast<size_t>(num_microbatches) +
         static_cast<size_t>(message.microbatch);
}

size_t message_count(int num_stages, int num_microbatches) {
  const size_t boundaries = num_stages > 1 ? static_cast<size_t>(num_stages - 1) : 1;
  return 2 * boundaries * static_cast<size_t>(num_microbatches);
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
  const size_t count = message_count(lowered.num_stages, lowered.num_microbatches);
  MessageSegments out{std::vector<int>(count, -1), std::vector<int>(count, -1)};
  for (int r = 0; r < lowered.num_ranks; ++r) {
    const std::vector<size_t> ends = step_segment_ends(lowered, r, microbatches_per_step);
    int segment = 0;
    for (size_t p = 0; p < lowered.actions[r].size(); ++p) {
      while (p >= ends[segment]) ++segment;
      const Action& a = lowered.actions[r][p];
      if (!is_comm(a.op)) continue;
      const size_t index =
          message_index(message_of(a), lowered.num_stages, lowered.num_microbatches);
      (a.op == Op::SEND_F || a.op == Op::SEND_B ? out.sent_in : out.received_in)[index] = segment;
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

}  // namespace pptrain
