#include "pptrain/sim/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

namespace {

// Bytes of the message a SEND or RECV carries (skip messages: not counted).
double message_bytes(const Action& comm, const std::vector<StageBytes>& stages) {
  if (is_skip_message(comm)) return 0;
  // Forwards go into the later stage, gradients come back from it: the cut's message either way.
  const int later = std::max(comm.stage, comm_peer(comm).stage);
  return stages[later].message;
}

struct Peaks {
  double activations = 0;  // activations alone
  double messages = 0;     // activations and messages
  double transient = 0;    // activations, messages and one action's working memory
};

// Walks rank r's list in order: the most its activations hold at once, with its messages in
// flight, and with the working memory of the action running.
Peaks walk(const Schedule& s, int r, const std::vector<StageBytes>& stages,
           const MemoryRules& rules) {
  const std::vector<Action>& actions = s.actions[r];
  const std::vector<size_t> posted = receives_posted(actions, rules.recv_ahead);
  const auto releases = send_releases(s, r);
  std::vector<size_t> receives;
  for (size_t p = 0; p < actions.size(); ++p) {
    if (is_recv(actions[p].op)) receives.push_back(p);
  }
  std::map<std::pair<int, int>, double> inputs, output_grads;  // posted, by (stage, microbatch)
  std::map<size_t, double> sends;                              // in flight, by position
  double held = 0, messages = 0;
  Peaks peaks;
  size_t next = 0;
  const auto note = [&](double working) {
    peaks.activations = std::max(peaks.activations, held);
    peaks.messages = std::max(peaks.messages, held + messages);
    peaks.transient = std::max(peaks.transient, held + messages + working);
  };
  const auto take = [&messages](std::map<std::pair<int, int>, double>& from, const Action& a) {
    const auto it = from.find({a.stage, a.microbatch});
    if (it == from.end()) return;
    messages -= it->second;
    from.erase(it);
  };
  for (size_t p = 0; p < actions.size(); ++p) {
    const auto hold = [&](const Action& recv) {
      const double bytes = message_bytes(recv, stages);
      (recv.op == Op::RECV_F ? inputs : output_grads)[{recv.stage, recv.microbatch}] = bytes;
      messages += bytes;
    };
    const double notice = rules.sized_receives ? 0 : rules.notice_bytes;
    for (; next < posted[p]; ++next) {
      const Action& recv = actions[receives[next]];
      if (is_skip_message(recv)) continue;
      if (rules.sized_receives) hold(recv);
      messages += notice;
    }
    note(0);
    const Action& action = actions[p];
    // An unsized receive gets its buffer when its message comes, and lets its notice go.
    if (!rules.sized_receives && is_recv(action.op) && !is_skip_message(action)) {
      hold(action);
      note(0);
      messages -= notice;
    }
    if (is_send(action.op)) {
      sends[p] = message_bytes(action, stages) + (is_skip_message(action) ? 0 : notice);
      messages += sends[p];
      note(0);
    }
    if (const auto released = releases.find(p); released != releases.end()) {
      for (size_t send : released->second) messages -= sends.at(send);
    }
    for (const Action& atom : atoms_of(action)) {
      const StageBytes& stage = stages[atom.stage];
      switch (atom.op) {
        case Op::F:
          take(inputs, atom);  // the buffer is the input now, counted in the activation
          held += stage.activation;
          note(stage.forward_transient);
          break;
        case Op::I:
          note(stage.transient);
          held += stage.weight_stash - stage.activation;
          take(output_grads, atom);
          note(0);
          break;
        case Op::B:
          note(stage.transient);
          held -= stage.activation;
          take(output_grads, atom);
          break;
        case Op::W:
          note(stage.transient);
          held -= stage.weight_stash;
          break;
        default:
          break;
      }
    }
  }
  return peaks;
}

}  // namespace

std::vector<RankMemory> predict_memory(const ValidatedSchedule& lowered,
                                       const std::vector<StageBytes>& stages,
                                       const VersionRule& rule, const MemoryRules& rules) {
  const Schedule& s = *lowered;
  PPTRAIN_CHECK(static_cast<int>(stages.size()) == s.num_stages, "the memory model of ", s.name,
                " needs the bytes of its ", s.num_stages, " stages, got ", stages.size());
  PPTRAIN_CHECK(!rule.asynchronous() || rule.stages == s.num_stages, "the weight rule of ",
                rule.stages, " stages does not fit ", s.name, "'s ", s.num_stages);
  std::vector<RankMemory> out(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    RankMemory& m = out[r];
    const Peaks peaks = walk(s, r, stages, rules);
    m.activations = peaks.activations;
    m.messages = peaks.messages - peaks.activations;
    m.transient = peaks.transient - peaks.messages;
    for (int st : s.stages_of(r)) {
      const StageBytes& stage = stages[st];
      // More than one version: the live weights and a snapshot of each, each with gradients.
      const int versions = rule.versions_kept(st);
      const int copies = versions > 1 ? versions + 1 : 1;
      m.weights += copies * stage.weights;
      m.gradients += (copies + (rules.gradient_buffers ? 1 : 0)) * stage.weights;
      m.optimizer += stage.optimizer_state;
      m.data += stage.data;
    }
  }
  return out;
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
      "memory per rank (MiB): weights + gradients + optimizer + data + activations "
      "+ messages + transient = predicted";
  out += both ? "  measured  difference\n" : "\n";
  char line[256];
  for (size_t r = 0; r < predicted.size(); ++r) {
    const RankMemory& m = predicted[r];
    std::snprintf(line, sizeof line, "  rank %zu  %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f  %8.2f",
                  r, mib(m.weights), mib(m.gradients), mib(m.optimizer), mib(m.data),
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
    nlohmann::ordered_json rank = {{"weights", m.weights},         {"gradients", m.gradients},
                                   {"optimizer", m.optimizer},     {"data", m.data},
                                   {"activations", m.activations}, {"messages", m.messages},
                                   {"transient", m.transient},     {"total", m.total()}};
    if (r < measured.size()) rank["measured"] = measured[r];
    out.push_back(rank);
  }
  return out;
}

}  // namespace pptrain
