// Data parallelism over copies of the pipeline (--dp D): each stage's D copies average their
// gradients before the optimizer step, so D copies each trained on 1/D of the batch take the
// step one process would take on all of it.
//
//   GradientAverager average(copies, plan.replicas, stages);  // copies: this rank's copies' group
//   ...run the step's backwards...
//   average.start(stage);       // REDUCE_GRAD: as soon as the stage's last W of the step is done
//   auto done = average.finish(stages);    // every .grad is now the copies' mean
//
// A stage's gradients travel as one flat bucket, kept from step to step (so a step allocates
// nothing for it), summed by one all-reduce that runs on the transport's threads while the
// rank goes on computing, and divided by D when it is back. Every copy gets the same bits,
// so the copies' weights stay identical.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <vector>

#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"

namespace pptrain {

class GradientAverager {
 public:
  // `copies`: the transport among the D ranks holding the same `stages` (neither owned). D = 1:
  // every call does nothing.
  GradientAverager(Transport* copies, int replicas, const std::vector<Stage*>& stages);

  // Starts the all-reduce of `stage`'s gradients; once per stage per step, in the same order
  // on every copy.
  void start(int stage);
  // Starts the stages not started yet (in the constructor's order), waits for every sum, and
  // leaves the mean in each parameter's .grad. Returns when each stage's sum was known to be
  // complete (its wait returned), by stage index.
  std::map<int, std::chrono::steady_clock::time_point> finish();

 private:
  struct Bucket {
    std::vector<torch::Tensor> params;
    torch::Tensor flat;  // [sum of numel], float32
    PendingComm sum;
    bool started = false;
  };
  Transport* copies_;
  int replicas_;
  std::vector<int> order_;         // stage indices in the constructor's order
  std::map<int, Bucket> buckets_;  // stage index -> its bucket
};

}  // namespace pptrain
