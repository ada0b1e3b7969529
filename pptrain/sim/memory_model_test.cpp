// The memory model: its activations are the simulator's peak_activations for every schedule,
// its messages follow the runtime's rules on a hand-counted 1F1B, and weights, gradients and
// optimizer state count versions, snapshots and gradient buffers.
#include "pptrain/sim/memory_model.h"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <random>

#include "pptrain/common/check.h"
#include "pptrain/generators/registry.h"
#include "pptrain/generators/testing.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/simulator.h"

namespace pptrain {
namespace {

// Stage s holds activation 10 + s per microbatch and keeps 3 of it for W; messages of 1.
std::vector<StageBytes> uneven_stages(int num_stages) {
  std::vector<StageBytes> out(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    out[s].weights = 100;
    out[s].activation = 10 + s;
    out[s].weight_stash = 3;
  }
  return out;
}

TEST(MemoryModel, ActivationsAreTheSimulatorsPeakForEverySchedule) {
  for (const ScheduleEntry& entry : schedule_registry()) {
    if (entry.averages_copies) continue;
    for (int ranks : {2, 4}) {
      ScheduleOptions options;
      options.name = entry.name;
      options.ranks = ranks;
      options.microbatches = !entry.asynchronous() ? 4 * ranks : 8 * ranks;
      Schedule schedule;
      try {
        schedule = make_schedule(options);
      } catch (const UserError&) {
        continue;  // a size this schedule does not take
      }
      const ValidatedSchedule lowered = validate(lower(schedule));
      const std::vector<StageBytes> stages = uneven_stages(lowered->num_stages);
      CostModel cost;
      for (const StageBytes& s : stages) {
        cost.stage_activation.push_back(s.activation);
        cost.stage_weight_stash.push_back(s.weight_stash);
      }
      const SimResult sim = simulate(lowered, cost);
      const std::vector<RankMemory> memory = predict_memory(lowered, stages);
      ASSERT_EQ(memory.size(), sim.ranks.size());
      for (size_t r = 0; r < memory.size(); ++r) {
        EXPECT_DOUBLE_EQ(memory[r].activations, sim.ranks[r].peak_activations)
            << entry.name << " P=" << ranks << " rank " << r;
        EXPECT_EQ(memory[r].messages, 0) << entry.name;  // no message bytes given
      }
    }
  }
}

// 1F1B on 2 ranks, M = 4, one receive posted ahead. Rank 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0
// ... Its sends are let go once rank 1 has shown that it posted their receives
// (send_releases); its gradient receives hold a buffer from their posting to their B's end.
TEST(MemoryModel, MessagesFollowTheRuntimesPostingAndReleases) {
  const ValidatedSchedule lowered = validate(lower(make_schedule({"1f1b", 2, 4})));
  std::vector<StageBytes> stages(2);
  stages[0].activation = 100;
  stages[1].activation = 100;
  stages[1].message = 1;
  MemoryRules rules;
  rules.recv_ahead = 1;
  const std::vector<RankMemory> one = predict_memory(lowered, stages, VersionRule{}, rules);
  EXPECT_DOUBLE_EQ(one[0].activations, 200);  // two microbatches in flight, as the simulator
  // The peak, after SEND_F1: the copies of F0's and F1's outputs (F0's is let go after RECV_B0,
  // whose sender had received F0 before sending it; F1's only after RECV_B1) and the gradient
  // of microbatch 0, posted one ahead.
  EXPECT_DOUBLE_EQ(one[0].messages, 3);
  // A run's first step: a posted receive holds only a notice until its message comes, so how
  // far ahead receives are posted does not matter: the two copies in flight, and RECV_B0's
  // buffer once its message came, before F0's copy is let go.
  MemoryRules first;
  first.recv_ahead = -1;
  first.sized_receives = false;
  EXPECT_DOUBLE_EQ(predict_memory(lowered, stages, VersionRule{}, first)[0].messages, 3);
  // Every receive posted at the start: the four gradients' buffers from the first action on.
  rules.recv_ahead = -1;
  EXPECT_DOUBLE_EQ(predict_memory(lowered, stages, VersionRule{}, rules)[0].messages, 6);
  // Rank 1 receives the forwards: F takes a buffer as its input (counted in the activation).
  EXPECT_DOUBLE_EQ(one[1].activations, 100);
}

// A rank's peaks read off the runtime's rules action by action, with their list forms
// (receives_posted, send_releases) rather than the walk's compiled events: activations alone,
// with messages, with one action's working memory.
std::array<double, 3> peaks_by_the_rules(const Schedule& lowered, int r,
                                         const std::vector<StageBytes>& stages,
                                         const MemoryRules& rules) {
  const std::vector<Action>& actions = lowered.actions[r];
  const std::vector<size_t> posted = receives_posted(actions, rules.recv_ahead);
  const std::map<size_t, std::vector<size_t>> releases = send_releases(lowered, r);
  std::vector<size_t> receives;
  std::map<size_t, size_t> receive_of;  // [message_index] the position of its receive here
  for (size_t p = 0; p < actions.size(); ++p) {
    if (!is_recv(actions[p].op)) continue;
    receives.push_back(p);
    if (!is_skip_message(actions[p])) receive_of[message_index(actions[p], lowered)] = p;
  }
  const auto bytes_of = [&](const Action& comm) {
    return is_skip_message(comm) ? -1 : message_of(comm).boundary + 1;
  };
  const double notice = rules.sized_receives ? 0 : rules.notice_bytes;
  std::map<size_t, double> buffer;  // [position of the SEND or RECV] the bytes it holds
  double held = 0, messages = 0;
  std::array<double, 3> peak = {0, 0, 0};
  const auto note = [&](double working) {
    peak[0] = std::max(peak[0], held);
    peak[1] = std::max(peak[1], held + messages);
    peak[2] = std::max(peak[2], held + messages + working);
  };
  const auto hold = [&](size_t position, double bytes) {
    buffer[position] = bytes;
    messages += bytes;
  };
  const auto let_go = [&](size_t position) {
    messages -= buffer[position];
    buffer[position] = 0;
  };
  // The receive of the message an F takes as input, or a backward as its gradient.
  const auto take = [&](const Action& atom) {
    const bool forward = atom.op == Op::F;
    const int boundary = forward ? atom.stage - 1 : atom.stage;
    if (boundary < 0 || boundary >= lowered.num_stages - 1) return;
    const auto it = receive_of.find(message_index(Message{!forward, boundary, atom.microbatch},
                                                  lowered.num_stages, lowered.num_microbatches));
    if (it != receive_of.end()) let_go(it->second);
  };
  size_t next = 0;
  for (size_t p = 0; p < actions.size(); ++p) {
    for (; next < posted[p]; ++next) {
      const Action& recv = actions[receives[next]];
      if (is_skip_message(recv)) continue;
      hold(receives[next], rules.sized_receives ? stages[bytes_of(recv)].message : notice);
    }
    note(0);
    const Action& a = actions[p];
    if (is_recv(a.op) && !is_skip_message(a) && !rules.sized_receives) {
      messages -= buffer[p];
      hold(p, stages[bytes_of(a)].message);
      messages += notice;
      note(0);
      messages -= notice;
    }
    if (is_send(a.op)) {
      hold(p, bytes_of(a) >= 0 ? stages[bytes_of(a)].message + notice : 0);
      note(0);
    }
    if (const auto it = releases.find(p); it != releases.end()) {
      for (size_t send : it->second) let_go(send);
    }
    for (const Action& atom : atoms_of(a)) {
      const StageBytes* stage = atom.stage >= 0 ? &stages[atom.stage] : nullptr;
      switch (atom.op) {
        case Op::F:
          take(atom);
          held += stage->activation;
          note(stage->forward_transient);
          break;
        case Op::I:
          note(stage->transient);
          held += stage->weight_stash - stage->activation;
          take(atom);
          note(0);
          break;
        case Op::B:
          note(stage->transient);
          held -= stage->activation;
          take(atom);
          break;
        case Op::W:
          note(stage->transient);
          held -= stage->weight_stash;
          break;
        default:
          break;
      }
    }
  }
  return peak;
}

// The walk gives, bit for bit, the peaks the runtime's rules give action by action: every
// schedule, with and without a skip message, its receives posted 1, 4 or all ahead, sized or
// holding a notice until their message comes, under uneven stage bytes.
TEST(MemoryModel, TheWalkIsTheRuntimesRulesActionByAction) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> bytes(0.5, 40.0);
  int compared = 0;
  testing::for_each_schedule(
      {2, 3, 4}, {1, 4, 9}, [&](const Schedule& made, const std::string& what) {
        const ValidatedSchedule validated = validate(made);
        std::vector<StageBytes> stages(made.num_stages);
        for (StageBytes& stage : stages) {
          stage.activation = bytes(rng);
          stage.weight_stash = stage.activation * 0.3;
          stage.transient = bytes(rng);
          stage.forward_transient = bytes(rng);
          stage.message = bytes(rng);
        }
        for (int ahead : {1, 4, -1}) {
          for (bool sized : {true, false}) {
            MemoryRules rules;
            rules.recv_ahead = ahead;
            rules.sized_receives = sized;
            rules.notice_bytes = sized ? 0 : 0.25;
            const std::vector<RankMemory> predicted =
                predict_memory(MemoryWalk(validated, ahead), stages, VersionRule{}, rules);
            for (int r = 0; r < made.num_ranks; ++r) {
              const std::array<double, 3> peak = peaks_by_the_rules(*validated, r, stages, rules);
              const std::string where = what + " rank " + std::to_string(r) + " ahead " +
                                        std::to_string(ahead) + (sized ? "" : " with notices");
              EXPECT_EQ(predicted[r].activations, peak[0]) << where;
              EXPECT_EQ(predicted[r].messages, peak[1] - peak[0]) << where;
              EXPECT_EQ(predicted[r].transient, peak[2] - peak[1]) << where;
              ++compared;
            }
          }
        }
      });
  EXPECT_GT(compared, 1000);
}

TEST(MemoryModel, WeightsCountSnapshotsAndGradientBuffers) {
  const int S = 4, M = 8;
  const ValidatedSchedule lowered = validate(lower(make_schedule({"pipedream", S, 3 * M})));
  std::vector<StageBytes> stages(S);
  for (StageBytes& s : stages) {
    s.weights = 10;
    s.optimizer_state = 20;
  }
  const VersionRule rule = version_rule_of("pipedream", S, M);
  const std::vector<RankMemory> memory = predict_memory(lowered, stages, rule);
  for (int r = 0; r < S; ++r) {
    // PipeDream keeps S - r versions on stage r: with more than one, each a snapshot beside
    // the live weights, each with its gradients.
    const int versions = rule.versions_kept(r);
    const int copies = versions > 1 ? versions + 1 : 1;
    EXPECT_DOUBLE_EQ(memory[r].weights, 10.0 * copies) << "rank " << r;
    EXPECT_DOUBLE_EQ(memory[r].gradients, 10.0 * copies) << "rank " << r;
    EXPECT_DOUBLE_EQ(memory[r].optimizer, 20) << "rank " << r;
  }
  EXPECT_EQ(rule.versions_kept(S - 1), 1);
  MemoryRules buffers;
  buffers.gradient_buffers = true;
  const ValidatedSchedule flush = validate(lower(make_schedule({"1f1b", S, M})));
  EXPECT_DOUBLE_EQ(predict_memory(flush, stages, VersionRule{}, buffers)[0].gradients, 20);
}

TEST(MemoryModel, AFreshOptimizersStateComesAfterTheBackwards) {
  RankMemory m;
  m.weights = 10;
  m.gradients = 10;
  m.optimizer = 20;
  m.activations = 15;
  m.messages = 2;
  m.transient = 1;
  EXPECT_DOUBLE_EQ(m.total(), 58);
  m.fresh_state = true;
  EXPECT_DOUBLE_EQ(m.total(), 40);  // 10 + 10 + max(18, 20)
  m.activations = 30;
  EXPECT_DOUBLE_EQ(m.total(), 53);
}

TEST(MemoryModel, RefusesStagesOfAnotherCount) {
  const ValidatedSchedule lowered = validate(lower(make_schedule({"1f1b", 2, 4})));
  EXPECT_THROW(predict_memory(lowered, std::vector<StageBytes>(3)), UserError);
  EXPECT_THROW(
      predict_memory(lowered, std::vector<StageBytes>(2), version_rule_of("pipedream", 4, 4)),
      UserError);
}

}  // namespace
}  // namespace pptrain
