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
//   VersionRule rule{&find_weight_rule("pipedream"), /*stages=*/4, /*microbatches_per_step=*/8};
//   rule.forward_version(/*microbatch=*/10, /*stage=*/0);   // 7: W_0^(10-3)
//   rule.steps_after(10);                                   // true: every microbatch
//   rule.versions_kept(0);                                  // 4 in the pipelined 1F1B order
#pragma once

#include <string>
#include <vector>

namespace pptrain {

struct VersionRule;

// How a family of schedules updates its weights: the rule's answers for the questions of
// VersionRule below, given the rule's sizes (S, M, U). Each family states its rule in its own
// file (generators/families/); the synchronous one is here. A rule object is a constant that lives
// as long as the program; VersionRule points at it.
class WeightRule {
 public:
  virtual ~WeightRule() = default;
  // "flush", "pipedream", "vertical-sync", "2bw", ...: the name in logs, JSON and messages.
  virtual const char* name() const = 0;
  virtual bool asynchronous() const { return true; }
  // The defaults are those of a rule that steps once per mini-batch (M backwards) on one version.
  virtual int period(const VersionRule& r) const;
  virtual int forward_version(const VersionRule& r, int i, int stage) const = 0;
  virtual int backward_version(const VersionRule& r, int i, int stage) const {
    return forward_version(r, i, stage);
  }
  virtual bool backward_reruns_forward() const { return false; }
  virtual bool predicts() const { return false; }
  virtual int prediction_lag(const VersionRule& /*r*/, int /*stage*/, bool /*backward*/) const {
    return 0;
  }
  virtual int prediction_group(const VersionRule& /*r*/) const { return 1; }
  virtual int delay(const VersionRule& /*r*/, int /*stage*/) const { return 0; }
  virtual bool steps_after(const VersionRule& r, int i) const;
  virtual int versions_kept(const VersionRule& r, int stage) const = 0;
  virtual bool fits_1f1b(const VersionRule& /*r*/) const { return true; }
  virtual bool ties_parameters() const { return false; }
  // True when training corrects the delay of the rule's one version (a per-stage learning rate
  // and a correction of the backward's weights, train/pipemare.h).
  virtual bool corrects_delay() const { return false; }
};

// The synchronous rule: one version, a step after each mini-batch's flush.
const WeightRule& synchronous_rule();

struct VersionRule {
  const WeightRule* update = &synchronous_rule();  // the family's rule (never null)
  int stages = 1;                                  // S
  int microbatches_per_step = 1;  // M: a "step" of the log is M consecutive microbatches
  int update_interval = 1;        // U: for a rule that steps after every U backwards

  const char* name() const { return update->name(); }
  bool asynchronous() const { return update->asynchronous(); }
  // How many backwards of a stage each of its optimizer steps follows (1, U or M).
  int period() const { return update->period(*this); }
  // Version (optimizer steps of `stage`) whose weights the forward / backward of global
  // microbatch `i` uses. Synchronous: i / M, the step the microbatch belongs to.
  int forward_version(int i, int stage) const;
  int backward_version(int i, int stage) const;
  // True when a backward may use other weights than its forward: it then reruns the forward on
  // its own weights (recomputation) and takes the gradient there.
  bool backward_reruns_forward() const { return update->backward_reruns_forward(); }
  // Weight prediction: an action does not run on a version itself but on
  // W_s^(v) - lag x lr x d_s^(v), v = forward_version / backward_version, d the stage's
  // optimizer direction after its v-th step (train/weight_prediction.h) and lr that step's rate.
  bool predicts() const { return update->predicts(); }
  // The lag of that prediction, in optimizer steps of the stage: the steps expected between
  // the version the action starts from and the one the microbatch's gradient is applied to (the
  // papers' formulas, docs/ASYNC.md). 0 for the rules without prediction.
  int prediction_lag(int stage, bool backward) const {
    return update->prediction_lag(*this, stage, backward);
  }
  // The microbatches that share one prediction (1, or M when a mini-batch is predicted once, at
  // its first microbatch); the forward and backward versions of every microbatch of a group are
  // those of its first.
  int prediction_group() const { return update->prediction_group(*this); }
  // The most optimizer steps stage `stage` takes between a microbatch's forward and its
  // backward in the pipelined order, for a rule without stash (its delay tau); 0 otherwise.
  int delay(int stage) const { return update->delay(*this, stage); }
  // True when every stage steps its optimizer right after the backward of microbatch i (the
  // gradients of the microbatches since its previous step, summed in microbatch order).
  bool steps_after(int i) const { return update->steps_after(*this, i); }
  // The oldest version stage `stage` still needs once microbatch i's backward (and the step
  // after it, if any) is done: every later forward and backward uses this one or a newer one,
  // in any order that runs i+1's forward after i's backward or earlier (the one-process order
  // and the pipelined one; for a rule of one version it is the one-process order that needs
  // the older ones).
  int oldest_needed_after(int i, int stage) const;
  // The most versions stage `stage` holds at once in the pipelined order, where its forward of
  // microbatch i runs after max(0, i - (S-1-stage)) backwards (a predicting rule counts its
  // predicted copies). With 1 the stage computes on its live weights directly.
  int versions_kept(int stage) const { return update->versions_kept(*this, stage); }
  // False when the pipelined 1F1B order would ask for a version before it exists (too few
  // microbatches per step for the rule).
  bool fits_1f1b() const { return update->fits_1f1b(*this); }
  // Whether a parameter tied between stages can follow the rule (train/tied_parameters.h).
  bool ties_parameters() const { return update->ties_parameters(); }
};

// Per rank of `placement` (stage -> rank), the most versions one of its stages keeps in the
// pipelined order: what a run's `weight_versions` metric should show.
std::vector<int> weight_versions_per_rank(const VersionRule& rule,
                                          const std::vector<int>& stage_to_rank, int num_ranks);

}  // namespace pptrain
