#include "pptrain/schedule/reductions.h"

#include <algorithm>

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

Schedule add_grad_reductions(const Schedule& schedule) {
  PPTRAIN_CHECK(schedule.flushes, "schedule '", schedule.name,
                "' is asynchronous (no flush): its stages step their optimizers inside the run, "
                "so there is no step end at which to all-reduce the data-parallel gradients");
  Schedule out = remove_grad_reductions(schedule);
  for (size_t r = 0; r < out.actions.size(); ++r) {
    const auto& list = out.actions[r];
    // last[s]: position of the rank's last action completing stage s's weight gradients; the
    // stages in the order their last such atom appears.
    std::vector<int> last(out.num_stages, -1);
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      for (const Action& atom : atoms_of(list[i])) {
        if (!computes_weight_grads(atom.op)) continue;
        PPTRAIN_CHECK(atom.stage >= 0 && atom.stage < out.num_stages, "schedule '", schedule.name,
                      "': ", to_string(list[i]), " on rank ", r, " has a stage outside 0..",
                      out.num_stages - 1);
        last[atom.stage] = i;
        order.erase(std::remove(order.begin(), order.end(), atom.stage), order.end());
        order.push_back(atom.stage);
      }
    }
    std::vector<Action> reduced;
    reduced.reserve(list.size() + order.size());
    auto next = order.begin();
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      reduced.push_back(list[i]);
      if (next == order.end() || last[*next] != i) continue;
      // The sends right after the action are its own (lower()); they go first.
      while (i + 1 < static_cast<int>(list.size()) &&
             (list[i + 1].op == Op::SEND_F || list[i + 1].op == Op::SEND_B)) {
        reduced.push_back(list[++i]);
      }
      for (; next != order.end() && last[*next] <= i; ++next) {
        reduced.push_back(Action::make(Op::REDUCE_GRAD, *next, -1));
      }
    }
    out.actions[r] = std::move(reduced);
  }
  return out;
}

}  // namespace pptrain
