#include "pptrain/train/replicas.h"

#include "pptrain/common/check.h"

namespace pptrain {

GradientAverager::GradientAverager(Transport* copies, int replicas,
                                   const std::vector<Stage*>& stages)
    : copies_(copies), replicas_(replicas) {
  if (replicas_ == 1) return;
  PPTRAIN_ASSERT(copies_ && copies_->world_size() == replicas_, "the copies' group has ",
                 copies_ ? copies_->world_size() : 0, " ranks for ", replicas_, " copies");
  for (const Stage* stage : stages) {
    Bucket& b = buckets_[stage->index()];
    b.params = stage->parameters();
    int64_t numel = 0;
    for (const auto& p : b.params) numel += p.numel();
    b.flat = torch::empty({numel}, torch::kFloat32);  // allocated once, before any step
    order_.push_back(stage->index());
  }
}

void GradientAverager::start(int stage) {
  if (replicas_ == 1) return;
  Bucket& b = buckets_.at(stage);
  PPTRAIN_ASSERT(!b.started, "the gradients of stage ", stage, " were started twice in a step");
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : b.params) {
    b.flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
    offset += p.numel();
  }
  b.sum = copies_->allreduce_sum_async(b.flat);
  b.started = true;
}

std::map<int, std::chrono::steady_clock::time_point> GradientAverager::finish() {
  std::map<int, std::chrono::steady_clock::time_point> done;
  if (replicas_ == 1) return done;
  for (int stage : order_) {
    if (!buckets_.at(stage).started) start(stage);
  }
  torch::NoGradGuard no_grad;
  for (int stage : order_) {
    Bucket& b = buckets_.at(stage);
    b.sum.wait();
    done[stage] = std::chrono::steady_clock::now();
    b.flat.div_(replicas_);
    int64_t offset = 0;
    for (auto& p : b.params) {
      p.mutable_grad().copy_(b.flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
    b.started = false;
  }
  return done;
}

}  // namespace pptrain
