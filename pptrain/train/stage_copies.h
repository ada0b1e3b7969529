// The ranks that hold copies of the same stage combine their gradients before the optimizer
// step, so that every copy steps as one process on the whole batch would:
//   - data parallelism (--dp D): the D copies of the pipeline each trained on 1/D of the batch,
//     with their losses divided by their own M; they average (divide_by = D). With unequal
//     shares of the batch (--dp-shares) each copy's gradients, a mean over its own samples, are
//     weighed by its share of the batch before the sum (weight = share / batch, divide_by = 1),
//     which makes the mean over the whole batch. With --zero 1
//     each copy also keeps the optimizer state of only its share of the layers, steps those,
//     and hands their new weights to the other copies;
//   - a replicated schedule (chimera, gems, 1f1b-rr; Schedule::placement): each replica ran
//     some of the step's microbatches, their losses divided by the step's M; they sum
//     (divide_by = 1).
//
//   StageCopies copies({{&stage, group, plan.copies}, ...});   // group: the stage's copies
//   ...run the step's backwards...
//   copies.start_average(stage);   // REDUCE_GRAD: as soon as the stage's last W is done
//   auto done = copies.finish_average();   // every .grad is now the copies' mean
//   ...clip; step the optimizers of the layers this copy owns (zero_owners)...
//   copies.share_weights(owner, plan.copy_of(rank));   // --zero 1 only
//
// avgpipe's copies combine no gradients but pull their weights together every few steps
// (keep_centre once, then pull_to_centre).
//
// A stage's gradients travel as one flat bucket, kept from step to step (so a step allocates
// nothing for it), summed by one all-reduce that runs on the transport's threads while the
// rank goes on computing, and divided by D when it is back. Every copy gets the same bits, so
// the copies' weights stay identical.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"

namespace pptrain {

// --zero 1: which of D copies owns each layer's optimizer state, given the layers' parameter
// counts in order: each layer goes to the copy with the fewest parameters so far (the lowest
// index on a tie), so every copy computes the same owners and each holds about 1/D of the state.
std::vector<int> zero_owners(const std::vector<int64_t>& layer_numel, int replicas);

// One stage whose copies combine gradients: `group` is the transport among the ranks holding
// it (not owned), `divide_by` what their sum is divided by, `weight` what this copy's gradients
// are multiplied by before it (1: as they are).
struct StageGroup {
  const Stage* stage = nullptr;
  Transport* group = nullptr;
  int divide_by = 1;
  double weight = 1;
};

// How avgpipe's D copies pull their weights together (StageCopies::pull_to_centre): after
// every `every`-th step, with `alpha` (EASGD's moving rate is D x alpha).
struct CopyAveraging {
  int every = 4;
  double alpha = 0;
};
// The averaging the family's options given say (--avg-interval, default 4; --avg-alpha,
// default 0.9 / D): UserError naming --avg-alpha unless 0 < alpha < 2 / D, where the centre is
// stable.
CopyAveraging copy_averaging(const FamilyValues& family, int copies);

class StageCopies {
 public:
  // No stages: every call does nothing.
  explicit StageCopies(const std::vector<StageGroup>& stages);

  // Starts the all-reduce of `stage`'s gradients; once per stage per step, in the same order
  // on every copy.
  void start_average(int stage);
  // Starts the stages not started yet (in the constructor's order), waits for every sum in the
  // order they were started, and leaves the result in each parameter's .grad. Returns when each
  // stage's sum was known to be complete (its wait returned), by stage index.
  std::map<int, std::chrono::steady_clock::time_point> finish_average();
  // After each copy updated the layers it owns (`owner`: by model layer index, as from
  // zero_owners over the stages' layers in order), every copy gets the owners' weights: each
  // contributes its own layers and zeros elsewhere to one sum (an all-gather as an all-reduce:
  // twice the bytes, but exact, as x + 0 = x).
  void share_weights(const std::map<int, int>& owner, int replica);

  // Elastic averaging (avgpipe): the copies do not combine gradients; every few steps each
  // copy's weights x_j are pulled towards a centre c and the centre towards the copies,
  //   x_j <- x_j - alpha (x_j - c),   c <- c + alpha (sum_j x_j - D c),   D = divide_by,
  // both from the values before the pull, the sum by one all-reduce per stage. The centre is
  // the same bits on every copy. keep_centre() starts it at the stages' weights now (the
  // copies' common start); pull_to_centre() needs it.
  void keep_centre();
  void pull_to_centre(double alpha);

  // Bytes this rank sent in all-reduces since the last call: a ring all-reduce of N bytes over
  // D ranks sends 2 (D-1) / D x N from each.
  int64_t take_bytes_sent() { return std::exchange(bytes_sent_, 0); }

 private:
  struct Bucket {
    StageGroup where;
    std::vector<torch::Tensor> params;  // in layer order
    std::vector<int> layer_of;          // [param] -> model layer index
    torch::Tensor flat;                 // [sum of numel], float32
    torch::Tensor centre;               // the same shape: elastic averaging's centre, if kept
    PendingComm sum;
    bool started = false;
  };

  std::vector<int> order_;         // stage indices in the constructor's order
  std::vector<int> started_;       // stage indices in the order their sums started this step
  std::map<int, Bucket> buckets_;  // stage index -> its bucket
  int64_t bytes_sent_ = 0;

  void count_all_reduce(const Bucket& b);
};

}  // namespace pptrain
