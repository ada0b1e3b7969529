// Data parallelism over copies of the pipeline (--dp D): each stage's D copies average their
// gradients before the optimizer step, so D copies each trained on 1/D of the batch take the
// step one process would take on all of it.
//
//   GradientAverager average(copies, plan.replicas);   // copies: the group of this rank's copies
//   ...run the step's backwards...
//   for (Stage* stage : stages) average.start(*stage); // each as soon as its last W is done
//   average.finish();                                  // every .grad is now the copies' mean
//
// A stage's gradients travel as one flat bucket, kept from step to step (so a step allocates
// nothing for it), summed by one all-reduce that runs on the transport's threads while the
// rank goes on computing, and divided by D when it is back. Every copy gets the same bits,
// so the copies' weights stay identical.
#pragma once

#include <torch/torch.h>

#include <map>
#include <vector>

#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"

namespace pptrain {

class GradientAverager {
 public:
  // `copies`: the transport among the D ranks holding the same stages (not owned). D = 1: every
  // call does nothing.
  GradientAverager(Transport* copies, int replicas) : copies_(copies), replicas_(replicas) {}

  // Starts the all-reduce of `stage`'s gradients; once per stage per step, in the same order
  // on every copy.
  void start(const Stage& stage);
  // Starts the stages not started yet (in `stages`' order), waits for every sum, and leaves the
  // mean in each parameter's .grad.
  void finish(const std::vector<Stage*>& stages);

 private:
  struct Bucket {
    std::vector<torch::Tensor> params;
    torch::Tensor flat;  // [sum of numel], float32
    PendingComm sum;
    bool started = false;
  };
  Bucket& bucket(const Stage& stage);

  Transport* copies_;
  int replicas_;
  std::map<int, Bucket> buckets_;  // stage index -> its bucket
};

}  // namespace pptrain
