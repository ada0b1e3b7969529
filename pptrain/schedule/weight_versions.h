// Which weights an asynchronous schedule's actions use, as a rule of the microbatch number.
//
// A synchronous schedule steps every stage's optimizer once per mini-batch, after the flush, so
// every action of a step uses the same weights. An asynchronous one does not flush: microbatches
// are numbered i = 0, 1, 2, ... over the whole run, a stage steps its optimizer after the
// backwards this rule names, and the forward and backward of microbatch i at stage s use a
// version fixed by the rule, W_s^(k) being stage s's weights after k optimizer steps. Because
// the rule depends on i and s only, a pipelined run and the one-process run of the same stages
// (`--pp 1 --stages S`) compute the same numbers; timing cannot change them.
//
//   VersionRule rule{WeightUpdate::kPipeDream, /*stages=*/4, /*microbatches_per_step=*/8};
//   rule.forward_version(/*microbatch=*/10, /*stage=*/0);   // 7: W_0^(10-3)
//   rule.steps_after(10);                                   // true: every microbatch
//   rule.versions_kept(0);                                  // 4 in the pipelined 1F1B order
#pragma once

#include <string>
#include <vector>

namespace pptrain {

enum class WeightUpdate {
  kFlush,         // synchronous: one version, a step after each mini-batch's flush
  kPipeDream,     // PipeDream weight stashing: step after every microbatch, F and B of i use
                  // W_s^(max(0, i-(S-1-s)))
  kVerticalSync,  // PipeDream with vertical sync: every stage uses W_s^(max(0, i-(S-1)))
  kTwoBW,         // PipeDream-2BW: microbatches of step k use W^(k-1); step after each
                  // mini-batch: W^(k+1) = W^(k) - opt(grad f(W^(k-1))), W^(-1) = W^(0)
  kPipeMare,      // PipeMare: no stash, a step after each mini-batch; the forward of i uses the
                  // newest weights at its time, W_s^((i-(S-1-s))/M), its backward the newest at
                  // its own, W_s^(i/M) (docs/ASYNC.md)
  kAmpNet,        // AMPNet: no stash, a step after every U backwards (update_interval); forward
                  // and backward on the newest weights at their time, as pipemare with U for M
  kSpecTrain,     // SpecTrain: a step after every backward; forward and backward on weights
                  // predicted from the newest ones along the optimizer's smoothed direction
  kXPipe,         // XPipe: a step after each mini-batch; forward and backward on weights
                  // predicted once per mini-batch (its first microbatch) along that direction
  kWPipe,         // WPipe: a step after each mini-batch; the first half of the stages (group
                  // 1) as 2bw, W^(k-1) for step k, the second half (group 2) on W^(k), fresh
};

// "flush", "pipedream", "vertical-sync", "2bw", "pipemare", "ampnet", "spectrain", "xpipe",
// "wpipe": the name in logs and messages.
const char* update_name(WeightUpdate update);

struct VersionRule {
  WeightUpdate update = WeightUpdate::kFlush;
  int stages = 1;                 // S
  int microbatches_per_step = 1;  // M: a "step" of the log is M consecutive microbatches
  int update_interval = 1;        // U of kAmpNet: a stage steps after every U backwards

  bool asynchronous() const { return update != WeightUpdate::kFlush; }
  // How many backwards of a stage each of its optimizer steps follows: 1 (pipedream, vertical
  // sync, spectrain), U (ampnet), M (the others).
  int period() const;
  // Version (optimizer steps of `stage`) whose weights the forward / backward of global
  // microbatch `i` uses. For kFlush: i / M, the step the microbatch belongs to.
  int forward_version(int i, int stage) const;
  int backward_version(int i, int stage) const;
  // True when a backward may use other weights than its forward (pipemare): it then reruns the
  // forward on its own weights (recomputation) and takes the gradient there.
  bool backward_reruns_forward() const {
    return update == WeightUpdate::kPipeMare || update == WeightUpdate::kAmpNet || predicts();
  }
  // Weight prediction (spectrain, xpipe): an action does not run on a version itself but on
  // W_s^(v) - lag x lr x d_s^(v), v = forward_version / backward_version, d the stage's
  // optimizer direction after its v-th step (train/weight_prediction.h) and lr that step's rate.
  bool predicts() const {
    return update == WeightUpdate::kSpecTrain || update == WeightUpdate::kXPipe;
  }
  // The lag of that prediction, in optimizer steps of the stage: the steps expected between
  // the version the action starts from and the one the microbatch's gradient is applied to.
  // SpecTrain: forward floor(s/2) + S-1-s, backward floor(s/2); XPipe: forward
  // round((S + M - s/2 - 2) / M), backward round((M - 1 + floor(s/2)) / M), ties to even (the
  // papers' formulas, docs/ASYNC.md). 0 for the rules without prediction.
  int prediction_lag(int stage, bool backward) const;
  // The microbatches that share one prediction: 1 for spectrain, M for xpipe (the mini-batch,
  // predicted at its first microbatch, "the bellwether"); the forward and backward versions of
  // every microbatch of a group are those of its first.
  int prediction_group() const {
    return update == WeightUpdate::kXPipe ? microbatches_per_step : 1;
  }
  // The most optimizer steps stage `stage` takes between a microbatch's forward and its
  // backward in the pipelined order: ceil((S-1-stage) / M) for pipemare, ceil((S-1-stage) / U)
  // for ampnet, 0 for every other rule. PipeMare's delay tau of the stage.
  int delay(int stage) const;
  // True when every stage steps its optimizer right after the backward of microbatch i (the
  // gradients of the microbatches since its previous step, summed in microbatch order).
  bool steps_after(int i) const;
  // The oldest version stage `stage` still needs once microbatch i's backward (and the step
  // after it, if any) is done: every later forward and backward uses this one or a newer one,
  // in any order that runs i+1's forward after i's backward or earlier (the one-process order
  // and the pipelined one; for pipemare's one version it is the one-process order that needs
  // the older ones).
  int oldest_needed_after(int i, int stage) const;
  // The most versions stage `stage` holds at once in the pipelined 1F1B order, where its
  // forward of microbatch i runs after max(0, i - (S-1-stage)) backwards: pipedream S - stage,
  // vertical sync S, 2bw 2, flush, pipemare and ampnet 1; spectrain 2 (the live weights and one
  // predicted copy), xpipe 3 (the live weights, the mini-batch's forward prediction and its
  // backward prediction), less a copy for each pass whose lag is 0; wpipe 2 on its first group,
  // 1 on its second. With 1 the stage computes on its live weights directly.
  int versions_kept(int stage) const;
  // False when the pipelined 1F1B order would ask for a version before it exists: 2BW with
  // fewer than S - 1 microbatches per step (its stage 0 would run two steps ahead). (wpipe has
  // its own order, make_wpipe, which waits for the versions.)
  bool fits_1f1b() const;
  // Whether a parameter tied between stages can follow the rule (train/tied_parameters.h):
  // synchronous, pipedream and 2bw.
  bool ties_parameters() const {
    return update == WeightUpdate::kFlush || update == WeightUpdate::kPipeDream ||
           update == WeightUpdate::kTwoBW;
  }
  // wpipe: stage `stage` is in the first group (the first half of the stages, S / 2 of them).
  bool in_first_group(int stage) const { return stage < stages / 2; }
};

// Per rank of `placement` (stage -> rank), the most versions one of its stages keeps in the
// pipelined order: what a run's `weight_versions` metric should show.
std::vector<int> weight_versions_per_rank(const VersionRule& rule,
                                          const std::vector<int>& stage_to_rank, int num_ranks);

}  // namespace pptrain
