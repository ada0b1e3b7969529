#include "pptrain/train/stage_copies.h"

#include <algorithm>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"

namespace pptrain {

CopyAveraging copy_averaging(const FamilyValues& family, int copies) {
  CopyAveraging out;
  out.every = family_int(family, "--avg-interval", out.every);
  out.alpha = family_number(family, "--avg-alpha", 0.9 / copies);
  PPTRAIN_CHECK(out.alpha > 0 && out.alpha * copies < 2, "--avg-alpha must be in (0, 2 / D) = (0, ",
                2.0 / copies, "), got ", out.alpha);
  return out;
}

std::vector<int> zero_owners(const std::vector<int64_t>& layer_numel, int replicas) {
  std::vector<int64_t> held(replicas, 0);
  std::vector<int> owner;
  for (int64_t numel : layer_numel) {
    const int least = static_cast<int>(std::min_element(held.begin(), held.end()) - held.begin());
    held[least] += numel;
    owner.push_back(least);
  }
  return owner;
}

StageCopies::StageCopies(const std::vector<StageGroup>& stages) {
  for (const StageGroup& where : stages) {
    const Stage* stage = where.stage;
    PPTRAIN_ASSERT(where.group && where.group->world_size() > 1 && where.divide_by >= 1, "stage ",
                   stage->index(), " has no group of copies");
    Bucket& b = buckets_[stage->index()];
    b.where = where;
    int64_t numel = 0;
    for (int i = 0; i < stage->num_layers(); ++i) {
      for (const auto& p : stage->layer_parameters(i)) {
        b.params.push_back(p);
        b.layer_of.push_back(stage->first_layer() + i);
        numel += p.numel();
      }
    }
    b.flat = torch::empty({numel}, torch::kFloat32);  // allocated once, before any step
    order_.push_back(stage->index());
  }
}

void StageCopies::count_all_reduce(const Bucket& b) {
  const int64_t d = b.where.group->world_size();
  bytes_sent_ += 2 * (d - 1) * tensor_bytes(b.flat) / d;
}

void StageCopies::start_average(int stage) {
  if (buckets_.empty()) return;
  Bucket& b = buckets_.at(stage);
  PPTRAIN_ASSERT(!b.started, "the gradients of stage ", stage, " were started twice in a step");
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : b.params) {
    b.flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
    offset += p.numel();
  }
  if (b.where.weight != 1) b.flat.mul_(b.where.weight);
  b.sum = b.where.group->allreduce_sum_async(b.flat);
  count_all_reduce(b);
  b.started = true;
  started_.push_back(stage);
}

std::map<int, std::chrono::steady_clock::time_point> StageCopies::finish_average() {
  std::map<int, std::chrono::steady_clock::time_point> done;
  for (int stage : order_) {
    if (!buckets_.at(stage).started) start_average(stage);
  }
  torch::NoGradGuard no_grad;
  // In the order they started: a loopback transport sums when waited on.
  for (int stage : std::exchange(started_, {})) {
    Bucket& b = buckets_.at(stage);
    b.sum.wait();
    done[stage] = std::chrono::steady_clock::now();
    if (b.where.divide_by > 1) b.flat.div_(b.where.divide_by);
    int64_t offset = 0;
    for (auto& p : b.params) {
      p.mutable_grad().copy_(b.flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
    b.started = false;
  }
  return done;
}

namespace {

// The parameters laid end to end in `flat`, and back.
void flatten_into(const std::vector<torch::Tensor>& params, torch::Tensor& flat) {
  int64_t offset = 0;
  for (const auto& p : params) {
    flat.narrow(0, offset, p.numel()).copy_(p.reshape(-1));
    offset += p.numel();
  }
}

}  // namespace

void StageCopies::keep_centre() {
  torch::NoGradGuard no_grad;
  for (auto& [stage, b] : buckets_) {
    b.centre = torch::empty_like(b.flat);
    flatten_into(b.params, b.centre);
  }
}

void StageCopies::pull_to_centre(double alpha) {
  torch::NoGradGuard no_grad;
  for (int stage : order_) {
    Bucket& b = buckets_.at(stage);
    PPTRAIN_ASSERT(b.centre.defined(), "stage ", stage, ": pull_to_centre before keep_centre");
    flatten_into(b.params, b.flat);
    b.where.group->allreduce_sum(b.flat);  // sum_j x_j
    count_all_reduce(b);
    int64_t offset = 0;
    for (auto& p : b.params) {
      p.mul_(1 - alpha).add_(b.centre.narrow(0, offset, p.numel()).view_as(p), alpha);
      offset += p.numel();
    }
    b.centre.mul_(1 - alpha * b.where.divide_by).add_(b.flat, alpha);
  }
}

void StageCopies::share_weights(const std::map<int, int>& owner, int replica) {
  torch::NoGradGuard no_grad;
  for (int stage : order_) {
    Bucket& b = buckets_.at(stage);
    int64_t offset = 0;
    for (size_t i = 0; i < b.params.size(); ++i) {
      auto part = b.flat.narrow(0, offset, b.params[i].numel());
      if (owner.at(b.layer_of[i]) == replica) {
        part.copy_(b.params[i].reshape(-1));
      } else {
        part.zero_();
      }
      offset += b.params[i].numel();
    }
    b.where.group->allreduce_sum(b.flat);
    count_all_reduce(b);
    offset = 0;
    for (auto& p : b.params) {
      p.copy_(b.flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
}

}  // namespace pptrain
