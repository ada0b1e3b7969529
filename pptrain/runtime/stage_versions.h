// The weight versions one stage holds for an asynchronous schedule (schedule/weight_versions.h).
//
// The live Stage holds the weights the optimizer steps. When a rule needs more than one version
// at a time, every version a forward uses is a separate copy (a snapshot) and the forward graph
// is built on that copy's tensors: the optimizer can then step the live weights in place while
// graphs of older versions still wait for their backward (autograd rejects a saved tensor that
// changed). Snapshots are taken of the live weights when a version is first used and given back
// to a pool when no later action needs them; a backward's gradients go from its snapshot into
// the live weights' .grad before the optimizer steps. With one version the stage computes on the
// live weights directly.
//
//   StageVersions versions(&stage, [&] { return make_stage(model, 2, range); },
//   /*snapshots=*/true); Stage& w = versions.weights(rule.forward_version(i, 2));   // forward and
//   backward on w versions.gradients_to_live(rule.backward_version(i, 2));
//   versions.release_older_than(rule.oldest_needed_after(i, 2));
//   optimizer.step(); versions.stepped();
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/tensor_file.h"

namespace pptrain {

class StageVersions {
 public:
  // `live` is not owned. `make_copy` builds a Stage of the same layers (any initial values).
  StageVersions(Stage* live, std::function<Stage()> make_copy, bool snapshots);

  // The stage holding `version`: the live one, or its snapshot (taken now if `version` is the
  // live version; InternalError for a version that is neither held nor live).
  Stage& weights(int version);
  // Moves the gradients the backwards left on `version`'s snapshot to the live weights, whose
  // gradients must be zero (they are between optimizer steps); the snapshot gets those zeros.
  // A swap of tensors, no copy. Nothing to do without snapshots.
  void gradients_to_live(int version);
  // Gives back the snapshots of versions older than `version`.
  void release_older_than(int version);
  // The optimizer stepped the live weights: they are now version live_version() + 1.
  void stepped() { ++live_version_; }

  int live_version() const { return live_version_; }
  // Distinct versions held now: the snapshots and the live weights.
  int held() const;

  // For a checkpoint between steps: the live version's number and gradients, and each
  // snapshot's weights and gradients, under `prefix`; and back, into the versions of a new
  // process whose live weights are the checkpoint's (UserError starting with `flag`).
  void save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const std::string& prefix, const NamedTensors& in, const std::string& flag);

 private:
  Stage* live_;
  std::function<Stage()> make_copy_;
  bool snapshots_;
  int live_version_ = 0;
  std::map<int, Stage> versions_;  // version -> its snapshot
  std::vector<Stage> pool_;        // released snapshots, reused

  Stage new_copy();  // from the pool, or made
};

}  // namespace pptrain
