#include "pptrain/sim/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

namespace {

using Event = MemoryWalk::Event;
static_assert(sizeof(Event) == 8, "a walk holds a few events per action");

// The stage whose StageBytes::message a SEND or RECV carries: forwards go into the later stage,
// gradients come back from it, the cut's message either way; -1 for a skip message (not counted).
int message_stage(const Action& comm) {
  if (is_skip_message(comm)) return -1;
  return message_of(comm).boundary + 1;  // the later stage of its cut
}

// Tables of one rank's list, kept across ranks so that a walk allocates them once.
struct RankTables {
  std::vector<size_t> receives;   // positions of the rank's receives, in order
  std::vector<int> receive_slot;  // [message_index] the slot of its receive here, -1: none
  std::vector<size_t> set;        // the entries of receive_slot this rank set
  std::vector<size_t> released;   // the slots of the sends one receive lets go
};

// Rank r's list as the walk's events, in the runtime's order, appended to `out`: one pass down
// the list with the runtime's rules for posting receives (ReceivesPosted) and letting go of
// sends (SendReleases), whose peers' ends `ends` has. Each message has a slot, its place among
// the rank's: a receive its place among the receives, a send the receives' count and its place
// among the sends.
void events_of(const Schedule& s, int r, int recv_ahead, const MessageEnds& ends, RankTables& t,
               std::vector<Event>& out) {
  const std::vector<Action>& actions = s.actions[r];
  // The receives in order (a receive is posted before the list reaches it), and the receive of
  // each message between adjacent stages by its message_index().
  t.receives.clear();
  t.set.clear();
  for (size_t p = 0; p < actions.size(); ++p) {
    const Action& a = actions[p];
    if (!is_recv(a.op)) continue;
    if (!is_skip_message(a)) {
      t.set.push_back(message_index(message_of(a), s.num_stages, s.num_microbatches));
      t.receive_slot[t.set.back()] = static_cast<int>(t.receives.size());
    }
    t.receives.push_back(p);
  }
  const int receives = static_cast<int>(t.receives.size());
  // The receive whose buffer an F takes as input, or a backward as its output gradient.
  const auto taken = [&](const Action& atom) {
    const bool forward = atom.op == Op::F;
    const int boundary = forward ? atom.stage - 1 : atom.stage;
    if (boundary < 0 || boundary >= s.num_stages - 1) return -1;
    return t.receive_slot[message_index(Message{!forward, boundary, atom.microbatch}, s.num_stages,
                                        s.num_microbatches)];
  };
  // An atom or a message per action, and a post and a release at most per message.
  out.reserve(actions.size() + 2 * t.receives.size());
  bool note = false;  // the peak is taken before the next event
  const auto add = [&](Event::Kind kind, int stage, int slot) {
    out.emplace_back(kind, note, stage, slot);
    note = false;
  };
  ReceivesPosted posting(t.receives.size(), recv_ahead);
  SendReleases releases;
  size_t posted = 0;  // receives posted so far
  int received = 0, sent = 0;
  for (size_t p = 0; p < actions.size(); ++p) {
    const Action& action = actions[p];
    const bool receive = is_recv(action.op);
    for (const size_t now = posting.next(receive); posted < now; ++posted) {
      const Action& recv = actions[t.receives[posted]];
      if (is_skip_message(recv)) continue;
      add(Event::kPost, message_stage(recv), static_cast<int>(posted));
    }
    note = true;
    if (receive) {
      const int slot = received++;
      if (!is_skip_message(action)) add(Event::kArrive, message_stage(action), slot);
      const MessageEnds::End& send = ends.sent_at[message_index(action, s)];
      t.released.clear();
      releases.received(send.rank, send.position, t.released);
      for (size_t released : t.released) add(Event::kRelease, -1, static_cast<int>(released));
    } else if (is_send(action.op)) {
      const int slot = receives + sent++;
      add(Event::kSend, message_stage(action), slot);
      const MessageEnds::End& receive = ends.received_at[message_index(action, s)];
      PPTRAIN_ASSERT(receive.rank >= 0, to_string(action), " has no matching receive");
      releases.sent(receive.rank, receive.position, static_cast<size_t>(slot));
    }
    for (const Action& atom : atoms_of(action)) {
      switch (atom.op) {
        case Op::F:
          add(Event::kForward, atom.stage, taken(atom));
          break;
        case Op::I:
          add(Event::kInput, atom.stage, taken(atom));
          break;
        case Op::B:
          add(Event::kBackward, atom.stage, taken(atom));
          break;
        case Op::W:
          add(Event::kWeight, atom.stage, -1);
          break;
        default:
          break;
      }
    }
    if (note) add(Event::kNote, -1, -1);  // the action had no event of its own
  }
  for (size_t index : t.set) t.receive_slot[index] = -1;  // clean for the next rank
}

struct Peaks {
  double activations = 0;  // activations alone
  double messages = 0;     // activations and messages
  double transient = 0;    // activations, messages and one action's working memory
};

// Walks a rank's events: the most its activations hold at once, with its messages in flight,
// and with the working memory of the action running. `slot` holds each message's bytes while it
// is held (a posted or arrived receive, a send in flight).
Peaks walk_rank(const std::vector<Event>& events, const std::vector<StageBytes>& stages,
                const MemoryRules& rules, std::vector<double>& slot) {
  double held = 0, messages = 0;
  Peaks peaks;
  const auto note = [&](double working) {
    peaks.activations = std::max(peaks.activations, held);
    peaks.messages = std::max(peaks.messages, held + messages);
    peaks.transient = std::max(peaks.transient, held + messages + working);
  };
  const auto hold = [&](const Event& e, double bytes) {
    slot[e.slot] = bytes;
    messages += bytes;
  };
  // A buffer let go: taken by its F (as the input now, counted in the activation) or its
  // backward, or a send released.
  const auto take = [&](const Event& e) {
    if (e.slot < 0) return;
    messages -= slot[e.slot];
    slot[e.slot] = 0;
  };
  const double notice = rules.sized_receives ? 0 : rules.notice_bytes;
  for (const Event& e : events) {
    if (e.noted) note(0);
    switch (e.kind) {
      case Event::kPost:
        // Sized as the tag's last message, or a notice until the message comes.
        hold(e, rules.sized_receives ? stages[e.stage].message : notice);
        break;
      case Event::kNote:  // noted, as above
        break;
      case Event::kArrive:
        if (rules.sized_receives) break;
        messages -= slot[e.slot];
        hold(e, stages[e.stage].message);
        messages += notice;
        note(0);
        messages -= notice;
        break;
      case Event::kSend:
        hold(e, e.stage >= 0 ? stages[e.stage].message + notice : 0);
        note(0);
        break;
      case Event::kRelease:
        take(e);
        break;
      case Event::kForward: {
        const StageBytes& stage = stages[e.stage];
        take(e);
        held += stage.activation;
        note(stage.forward_transient);
        break;
      }
      case Event::kInput: {
        const StageBytes& stage = stages[e.stage];
        note(stage.transient);
        held += stage.weight_stash - stage.activation;
        take(e);
        note(0);
        break;
      }
      case Event::kBackward: {
        const StageBytes& stage = stages[e.stage];
        note(stage.transient);
        held -= stage.activation;
        take(e);
        break;
      }
      case Event::kWeight: {
        const StageBytes& stage = stages[e.stage];
        note(stage.transient);
        held -= stage.weight_stash;
        break;
      }
    }
  }
  return peaks;
}

}  // namespace

MemoryWalk::MemoryWalk(const ValidatedSchedule& validated, int recv_ahead)
    : name_(validated.given().name),
      num_stages_(validated.given().num_stages),
      recv_ahead_(recv_ahead) {
  // A compute-only schedule is lowered here for the walk alone rather than through `validated`,
  // which would keep the lowered lists as long as it lives (the planner keeps hundreds of
  // validated schedules and never asks for their lowered lists).
  Schedule lowered_here;
  if (validated.lowered_here()) lowered_here = lower(validated.given());
  const Schedule& s = validated.lowered_here() ? lowered_here : *validated;
  const MessageEnds ends(s);
  RankTables tables;
  tables.receive_slot.assign(message_count(s.num_stages, s.num_microbatches), -1);
  events_.resize(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    events_of(s, r, recv_ahead, ends, tables, events_[r]);
    stages_of_.push_back(s.stages_of(r));
    slots_ = std::max(slots_, s.actions[r].size());
  }
}

std::vector<RankMemory> predict_memory(const MemoryWalk& walk,
                                       const std::vector<StageBytes>& stages,
                                       const VersionRule& rule, const MemoryRules& rules) {
  PPTRAIN_CHECK(static_cast<int>(stages.size()) == walk.num_stages(), "the memory model of ",
                walk.name(), " needs the bytes of its ", walk.num_stages(), " stages, got ",
                stages.size());
  PPTRAIN_CHECK(!rule.asynchronous() || rule.stages == walk.num_stages(), "the weight rule of ",
                rule.stages, " stages does not fit ", walk.name(), "'s ", walk.num_stages());
  PPTRAIN_ASSERT(rules.recv_ahead == walk.recv_ahead(), "a walk made for ", walk.recv_ahead(),
                 " receives ahead, used with ", rules.recv_ahead);
  std::vector<RankMemory> out(walk.num_ranks());
  std::vector<double> slot(walk.slots());
  for (int r = 0; r < walk.num_ranks(); ++r) {
    RankMemory& m = out[r];
    std::fill(slot.begin(), slot.end(), 0.0);
    const Peaks peaks = walk_rank(walk.events(r), stages, rules, slot);
    m.activations = peaks.activations;
    m.messages = peaks.messages - peaks.activations;
    m.transient = peaks.transient - peaks.messages;
    for (int st : walk.stages_of(r)) {
      const StageBytes& stage = stages[st];
      // More than one version: the live weights and a snapshot of each, each with gradients.
      const int versions = rule.versions_kept(st);
      const int copies = versions > 1 ? versions + 1 : 1;
      m.weights += copies * stage.weights;
      m.gradients += (copies + (rules.gradient_buffers ? 1 : 0)) * stage.weights;
      m.optimizer += stage.optimizer_state;
      m.data += stage.data;
      m.casts += stage.weight_casts;
    }
  }
  return out;
}

std::vector<RankMemory> predict_memory(const ValidatedSchedule& lowered,
                                       const std::vector<StageBytes>& stages,
                                       const VersionRule& rule, const MemoryRules& rules) {
  return predict_memory(MemoryWalk(lowered, rules.recv_ahead), stages, rule, rules);
}

namespace {

double mib(double bytes) {
  return bytes / (1 << 20);
}

}  // namespace

std::string format_memory(const std::vector<RankMemory>& predicted,
                          const std::vector<double>& measured) {
  const bool both = measured.size() == predicted.size();
  std::string out =
      "memory per rank (MiB): weights + casts + gradients + optimizer + data + activations "
      "+ messages + transient = predicted";
  out += both ? "  measured  difference\n" : "\n";
  char line[256];
  for (size_t r = 0; r < predicted.size(); ++r) {
    const RankMemory& m = predicted[r];
    std::snprintf(line, sizeof line,
                  "  rank %zu  %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f  %8.2f", r,
                  mib(m.weights), mib(m.casts), mib(m.gradients), mib(m.optimizer), mib(m.data),
                  mib(m.activations), mib(m.messages), mib(m.transient), mib(m.total()));
    out += line;
    if (both && measured[r] > 0) {
      std::snprintf(line, sizeof line, "  %8.2f  %+6.1f%%", mib(measured[r]),
                    100 * (m.total() - measured[r]) / measured[r]);
      out += line;
    }
    out += "\n";
  }
  return out;
}

nlohmann::ordered_json memory_json(const std::vector<RankMemory>& predicted,
                                   const std::vector<double>& measured) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t r = 0; r < predicted.size(); ++r) {
    const RankMemory& m = predicted[r];
    nlohmann::ordered_json rank = {
        {"weights", m.weights},     {"casts", m.casts},         {"gradients", m.gradients},
        {"optimizer", m.optimizer}, {"data", m.data},           {"activations", m.activations},
        {"messages", m.messages},   {"transient", m.transient}, {"total", m.total()}};
    if (r < measured.size()) rank["measured"] = measured[r];
    out.push_back(rank);
  }
  return out;
}

}  // namespace pptrain
