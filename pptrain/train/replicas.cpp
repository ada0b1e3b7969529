#include "pptrain/train/replicas.h"

#include "pptrain/common/check.h"

namespace pptrain {

GradientAverager::Bucket& GradientAverager::bucket(const Stage& stage) {
  Bucket& b = buckets_[stage.index()];
  if (!b.flat.defined()) {
    b.params = stage.parameters();
    int64_t numel = 0;
    for (const auto& p : b.params) numel += p.numel();
    b.flat = torch::empty({numel}, torch::kFloat32);
  }
  return b;
}

void GradientAverager::start(const Stage& stage) {
  if (replicas_ == 1) return;
  Bucket& b = bucket(stage);
  PPTRAIN_ASSERT(!b.started, "the gradients of stage ", stage.index(), " were started twice");
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : b.params) {
    b.flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
    offset += p.numel();
  }
  b.sum = copies_->allreduce_sum_async(b.flat);
  b.started = true;
}

void GradientAverager::finish(const std::vector<Stage*>& stages) {
  if (replicas_ == 1) return;
  for (const Stage* stage : stages) {
    if (!bucket(*stage).started) start(*stage);
  }
  torch::NoGradGuard no_grad;
  for (const Stage* stage : stages) {
    Bucket& b = bucket(*stage);
    b.sum.wait();
    b.flat.div_(replicas_);
    int64_t offset = 0;
    for (auto& p : b.params) {
      p.mutable_grad().copy_(b.flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
    b.started = false;
  }
}

}  // namespace pptrain
