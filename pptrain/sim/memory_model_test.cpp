// The memory model: its activations are the simulator's peak_activations for every schedule,
// its messages follow the runtime's rules on a hand-counted 1F1B, and weights, gradients and
// optimizer state count versions, snapshots and gradient buffers.
#include "pptrain/sim/memory_model.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"
#include "pptrain/schedule/registry.h"
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
      options.microbatches = entry.update == WeightUpdate::kFlush ? 4 * ranks : 8 * ranks;
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

TEST(MemoryModel, WeightsCountSnapshotsAndGradientBuffers) {
  const int S = 4, M = 8;
  const ValidatedSchedule lowered = validate(lower(make_schedule({"pipedream", S, 3 * M})));
  std::vector<StageBytes> stages(S);
  for (StageBytes& s : stages) {
    s.weights = 10;
    s.optimizer_state = 20;
  }
  const VersionRule rule = version_rule_of("pipedream", false, S, M);
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
  EXPECT_THROW(predict_memory(lowered, std::vector<StageBytes>(2),
                              version_rule_of("pipedream", false, 4, 4)),
               UserError);
}

}  // namespace
}  // namespace pptrain
