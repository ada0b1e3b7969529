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
};

// "flush", "pipedream", "vertical-sync", "2bw", "pipemare": the name in logs and messages.
const char* update_name(WeightUpdate update);

struct VersionRule {
  WeightUpdate update = WeightUpdate::kFlush;
  int stages = 1;                 // S
  int microbatches_per_step = 1;  // M: a "step" of the log is M consecutive microbatches

  bool asynchronous() const { return update != WeightUpdate::kFlush; }
  // Version (optimizer steps of `stage`) whose weights the forward / backward of global
  // microbatch `i` uses. For kFlush: i / M, the step the microbatch belongs to.
  int forward_version(int i, int stage) const;
  int backward_version(int i, int stage) const;
  // True when a backward may use other weights than its forward (pipemare): it then reruns the
  // forward on its own weights (recomputation) and takes the gradient there.
  bool backward_reruns_forward() const { return update == WeightUpdate::kPipeMare; }
  // The most optimizer steps stage `stage` takes between a microbatch's forward and its
  // backward in the pipelined order: ceil((S-1-stage) / M) for pipemare, 0 for every rule whose
  // backward uses its forward's version. PipeMare's delay tau of the stage.
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
  // vertical sync S, 2bw 2, flush and pipemare 1. With 1 the stage computes on its live weights
  // directly.
  int versions_kept(int stage) const;
  // False when the pipelined 1F1B order would ask for a version before it exists: 2BW with
  // fewer than S - 1 microbatches per step (its stage 0 would run two steps ahead).
  bool fits_1f1b() const;
};

// Per rank of `placement` (stage -> rank), the most versions one of its stages keeps in the
// pipelined order: what a run's `weight_versions` metric should show.
std::vector<int> weight_versions_per_rank(const VersionRule& rule,
                                          const std::vector<int>& stage_to_rank, int num_ranks);

}  // namespace pptrain
