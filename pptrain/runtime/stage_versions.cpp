#include "pptrain/runtime/stage_versions.h"

#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {

StageVersions::StageVersions(Stage* live, std::function<Stage()> make_copy, bool snapshots)
    : live_(live), make_copy_(std::move(make_copy)), snapshots_(snapshots) {}

Stage& StageVersions::weights(int version) {
  if (!snapshots_) {
    PPTRAIN_ASSERT(version == live_version_, "stage ", live_->index(), " keeps one version (",
                   live_version_, ") but version ", version, " was asked for");
    return *live_;
  }
  auto found = versions_.find(version);
  if (found != versions_.end()) return found->second;
  PPTRAIN_ASSERT(version == live_version_, "stage ", live_->index(), " no longer holds version ",
                 version, " (live: ", live_version_, ")");
  Stage copy = [&] {
    if (pool_.empty()) return make_copy_();
    Stage reused = std::move(pool_.back());
    pool_.pop_back();
    return reused;
  }();
  {
    torch::NoGradGuard no_grad;
    const auto from = live_->parameters();
    const auto to = copy.parameters();
    PPTRAIN_ASSERT(from.size() == to.size());
    for (size_t p = 0; p < from.size(); ++p) to[p].copy_(from[p]);
  }
  return versions_.emplace(version, std::move(copy)).first->second;
}

void StageVersions::gradients_to_live(int version) {
  if (!snapshots_) return;
  auto found = versions_.find(version);
  PPTRAIN_ASSERT(found != versions_.end(), "stage ", live_->index(), " has no version ", version);
  const auto from = found->second.parameters();
  const auto to = live_->parameters();
  for (size_t p = 0; p < from.size(); ++p) {
    if (!from[p].grad().defined()) continue;
    torch::Tensor summed = from[p].grad();
    from[p].mutable_grad() = to[p].grad().defined() ? to[p].grad() : torch::zeros_like(summed);
    to[p].mutable_grad() = summed;
  }
}

void StageVersions::release_older_than(int version) {
  while (!versions_.empty() && versions_.begin()->first < version) {
    pool_.push_back(std::move(versions_.begin()->second));
    versions_.erase(versions_.begin());
  }
}

int StageVersions::held() const {
  const bool live_snapshotted = versions_.count(live_version_) > 0;
  return static_cast<int>(versions_.size()) + (live_snapshotted ? 0 : 1);
}

}  // namespace pptrain
