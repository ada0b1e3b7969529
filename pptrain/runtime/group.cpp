#include "pptrain/runtime/group.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/runtime/loopback_transport.h"

namespace pptrain {
namespace {

class PlacedTransport : public Transport {
 public:
  PlacedTransport(std::unique_ptr<Transport> inner, std::vector<int> process_of)
      : PlacedTransport(*inner, std::move(process_of)) {
    owned_ = std::move(inner);
  }
  PlacedTransport(Transport& inner, std::vector<int> process_of)
      : inner_(&inner), process_of_(std::move(process_of)) {
    const int world = static_cast<int>(process_of_.size());
    for (int r = 0; r < world; ++r) {
      if (process_of_[r] == inner_->rank()) rank_ = r;
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return inner_->world_size(); }
  PendingComm send(const torch::Tensor& tensor, int peer, int tag) override {
    return inner_->send(tensor, process_of_.at(peer), tag);
  }
  PendingComm recv(const torch::Tensor& buffer, int peer, int tag) override {
    return inner_->recv(buffer, process_of_.at(peer), tag);
  }
  PendingComm allreduce_sum_async(const torch::Tensor& tensor) override {
    return inner_->allreduce_sum_async(tensor);
  }
  void barrier() override { inner_->barrier(); }
  // The inner subgroup of the members' processes (ascending, as it takes them), placed so that
  // its ranks are the positions in `members`.
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members) override {
    std::vector<int> processes;
    for (int member : members) processes.push_back(process_of_.at(member));
    std::vector<int> ascending = processes;
    std::sort(ascending.begin(), ascending.end());
    std::vector<int> position_of(members.size());  // [position in members] = inner position
    for (size_t i = 0; i < members.size(); ++i) {
      position_of[i] = static_cast<int>(
          std::lower_bound(ascending.begin(), ascending.end(), processes[i]) - ascending.begin());
    }
    return placed_transport(inner_->subgroup(ascending), position_of);
  }
  std::unique_ptr<Transport> independent(const std::string& name) override {
    return placed_transport(inner_->independent(name), process_of_);
  }
  LinkKind link_to(int peer) const override { return inner_->link_to(process_of_.at(peer)); }

 private:
  std::unique_ptr<Transport> owned_;  // inner_, unless its owner is another
  Transport* inner_;
  std::vector<int> process_of_;  // [rank here] = rank of inner
  int rank_ = -1;
};

// Whether `process_of` is the identity of `world` ranks; an assertion unless it is a permutation.
bool identity_of(const std::vector<int>& process_of, int world) {
  std::vector<int> sorted = process_of;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(world);
  for (int r = 0; r < world; ++r) identity[r] = r;
  PPTRAIN_ASSERT(sorted == identity, "a placement needs each of the ", world, " ranks once, got ",
                 process_of.size(), " entries");
  return process_of == identity;
}

}  // namespace

std::unique_ptr<Transport> placed_transport(std::unique_ptr<Transport> inner,
                                            const std::vector<int>& process_of) {
  if (identity_of(process_of, inner->world_size())) return inner;
  return std::make_unique<PlacedTransport>(std::move(inner), process_of);
}

std::unique_ptr<Transport> placed_view(Transport& inner, const std::vector<int>& process_of) {
  identity_of(process_of, inner.world_size());  // a permutation, the identity too
  return std::make_unique<PlacedTransport>(inner, process_of);
}

Group make_group(Transport& world, const std::vector<int>& members) {
  PPTRAIN_ASSERT(!members.empty() && std::is_sorted(members.begin(), members.end()) &&
                     std::adjacent_find(members.begin(), members.end()) == members.end() &&
                     members.front() >= 0 && members.back() < world.world_size() &&
                     std::count(members.begin(), members.end(), world.rank()) == 1,
                 "a group needs distinct ascending ranks of the world, this rank among them");
  Group group;
  if (static_cast<int>(members.size()) == world.world_size()) {
    group.view = &world;
  } else {
    group.owned = members.size() == 1 ? std::move(make_loopback_transports(1).front())
                                      : world.subgroup(members);
    group.view = group.owned.get();
  }
  return group;
}

}  // namespace pptrain
