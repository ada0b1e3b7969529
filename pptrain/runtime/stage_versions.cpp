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
  Stage copy = new_copy();
  {
    torch::NoGradGuard no_grad;
    const auto from = live_->parameters();
    const auto to = copy.parameters();
    PPTRAIN_ASSERT(from.size() == to.size());
    for (size_t p = 0; p < from.size(); ++p) to[p].copy_(from[p]);
  }
  return versions_.emplace(version, std::move(copy)).first->second;
}

Stage StageVersions::new_copy() {
  if (pool_.empty()) return make_copy_();
  Stage reused = std::move(pool_.back());
  pool_.pop_back();
  return reused;
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

void StageVersions::save_state(const std::string& prefix, NamedTensors& out) const {
  out[prefix + "live_version"] = number_tensor(live_version_);
  put_gradients(prefix + "live/", *live_, out);
  std::vector<torch::Tensor> held;
  for (const auto& [version, snapshot] : versions_) {
    held.push_back(number_tensor(version));
    put_weights(prefix + "version/" + std::to_string(version) + "/", snapshot, out);
  }
  put_tensors(prefix + "snapshots/", held, out);
}

void StageVersions::load_state(const std::string& prefix, const NamedTensors& in,
                               const std::string& flag) {
  live_version_ = static_cast<int>(number_of(in, prefix + "live_version", flag));
  take_gradients(prefix + "live/", in, *live_, flag);
  for (auto& [version, snapshot] : versions_) pool_.push_back(std::move(snapshot));
  versions_.clear();
  for (const torch::Tensor& number : take_tensors(prefix + "snapshots/", in, flag)) {
    const int version = static_cast<int>(number.item<int64_t>());
    PPTRAIN_CHECK(snapshots_, flag, ": the state in flight has snapshots of stage ", live_->index(),
                  ", whose schedule keeps one version");
    Stage copy = new_copy();
    take_weights(prefix + "version/" + std::to_string(version) + "/", in, copy, flag);
    versions_.emplace(version, std::move(copy));
  }
}

}  // namespace pptrain
