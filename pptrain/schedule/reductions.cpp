#include "pptrain/schedule/reductions.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

Schedule remove_grad_reductions(const Schedule& schedule) {
  Schedule out = schedule;
  for (auto& list : out.actions) {
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const Action& a) { return is_collective(a.op); }),
               list.end());
  }
  return out;
}

bool has_grad_reductions(const Schedule& schedule) {
  for (const auto& list : schedule.actions) {
    for (const auto& a : list) {
      if (is_collective(a.op)) return true;
    }
  }
  return false;
}

namespace {

// Position of each rank's last action completing each stage's weight gradients: [rank][stage],
// -1 where the rank completes none.
std::vector<std::vector<int>> last_weight_grads(const Schedule& schedule) {
  std::vector<std::vector<int>> last(schedule.actions.size(),
                                     std::vector<int>(schedule.num_stages, -1));
  for (size_t r = 0; r < schedule.actions.size(); ++r) {
    const auto& list = schedule.actions[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      for (const Action& atom : atoms_of(list[i])) {
        if (!computes_weight_grads(atom.op)) continue;
        PPTRAIN_CHECK(atom.stage >= 0 && atom.stage < schedule.num_stages, "schedule '",
                      schedule.name, "': ", to_string(list[i]), " on rank ", r,
                      " has a stage outside 0..", schedule.num_stages - 1);
        last[r][atom.stage] = i;
      }
    }
  }
  return last;
}

// Each rank's list with `reductions[i]` inserted after its position i (and after the SENDs that
// directly follow that action: lower() put them there, and a neighbour waits for them).
std::vector<Action> insert_after(const std::vector<Action>& list,
                                 const std::vector<std::vector<int>>& reductions) {
  std::vector<Action> out;
  out.reserve(list.size() + reductions.size());
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    out.push_back(list[i]);
    const std::vector<int>& stages = reductions[i];
    if (stages.empty()) continue;
    while (i + 1 < static_cast<int>(list.size()) &&
           (list[i + 1].op == Op::SEND_F || list[i + 1].op == Op::SEND_B)) {
      out.push_back(list[++i]);
    }
    for (int stage : stages) out.emplace_back(Op::REDUCE_GRAD, stage, -1);
  }
  return out;
}

// A replicated schedule: every rank holding a replica of a stage with several replicas reduces
// it. All replicas of a stage wait for each other, so every rank reduces in one global order:
// the stages by the latest of their replicas' last W or B (ties by stage), each reduction on a
// rank after its own last W or B of the stage and after the rank's previous reduction.
Schedule add_replica_reductions(Schedule out) {
  const auto last = last_weight_grads(out);
  std::vector<std::pair<int, int>> order;  // (latest position over replicas, stage)
  for (int s = 0; s < out.num_stages; ++s) {
    const std::vector<int> replicas = out.replicas_of(s);
    if (replicas.size() < 2) continue;
    int latest = -1;
    for (int r : replicas) latest = std::max(latest, last[r][s]);
    order.emplace_back(latest, s);
  }
  std::sort(order.begin(), order.end());
  for (int r = 0; r < out.num_ranks; ++r) {
    auto& list = out.actions[r];
    std::vector<std::vector<int>> reductions(list.size());
    int at = 0;  // position of the rank's previous reduction
    for (const auto& [latest, s] : order) {
      const std::vector<int> replicas = out.replicas_of(s);
      if (std::find(replicas.begin(), replicas.end(), r) == replicas.end()) continue;
      at = std::max(at, last[r][s]);
      PPTRAIN_CHECK(at >= 0, "schedule '", out.name, "': rank ", r, " holds stage ", s,
                    " but completes none of its weight gradients");
      reductions[at].push_back(s);
    }
    list = insert_after(list, reductions);
  }
  return out;
}

}  // namespace

std::vector<int> match_replica_reductions(const Schedule& schedule,
                                          const std::vector<std::vector<int>>& queues,
                                          std::vector<size_t>& head) {
  head.assign(queues.size(), 0);
  const auto waits_at = [&](int r) { return head[r] < queues[r].size() ? queues[r][head[r]] : -1; };
  std::vector<int> order;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < static_cast<int>(queues.size()); ++r) {
      const int stage = waits_at(r);
      if (stage < 0) continue;
      const std::vector<int> replicas = schedule.replicas_of(stage);
      if (!std::all_of(replicas.begin(), replicas.end(),
                       [&](int q) { return waits_at(q) == stage; })) {
        continue;
      }
      for (int q : replicas) ++head[q];
      order.push_back(stage);
      progress = true;
    }
  }
  return order;
}

Schedule with_grad_reductions(Schedule schedule, int copies, bool averages_copies) {
  if ((copies > 1 && !averages_copies) ||
      (schedule.replicated() && !has_grad_reductions(schedule))) {
    return add_grad_reductions(schedule);
  }
  return schedule;
}

Schedule add_grad_reductions(const Schedule& schedule) {
  PPTRAIN_CHECK(schedule.flushes, "schedule '", schedule.name,
                "' is asynchronous (no flush): its stages step their optimizers inside the run, "
                "so there is no step end at which to all-reduce the data-parallel gradients");
  if (schedule.replicated()) return add_replica_reductions(remove_grad_reductions(schedule));
  Schedule out = remove_grad_reductions(schedule);
  const auto last = last_weight_grads(out);
  for (size_t r = 0; r < out.actions.size(); ++r) {
    const auto& list = out.actions[r];
    // The stages in the order their last atom completing weight gradients appears on the rank
    // (two in one composite: in the order of its parts).
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      for (const Action& atom : atoms_of(list[i])) {
        if (!computes_weight_grads(atom.op) || last[r][atom.stage] != i) continue;
        order.erase(std::remove(order.begin(), order.end(), atom.stage), order.end());
        order.push_back(atom.stage);
      }
    }
    std::vector<std::vector<int>> reductions(list.size());
    for (int stage : order) reductions[last[r][stage]].push_back(stage);
    out.actions[r] = insert_after(list, reductions);
  }
  return out;
}

}  // namespace pptrain
