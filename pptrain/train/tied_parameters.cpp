#include "pptrain/train/tied_parameters.h"

#include <algorithm>

#include "pptrain/common/check.h"
#include "pptrain/models/tensor_bundle.h"
#include "pptrain/train/control_tags.h"

namespace pptrain {
namespace {

// A copy's dtype and shape as int64 words: dtype code, dims, sizes (kWords in all, 0-padded).
constexpr int64_t kWords = 10;

std::vector<int64_t> kind_of(const torch::Tensor& t, const std::string& name) {
  PPTRAIN_CHECK(t.dim() + 2 <= kWords, "tied parameter '", name, "' has ", t.dim(),
                " dimensions; at most ", kWords - 2);
  std::vector<int64_t> words = {static_cast<int64_t>(t.scalar_type()), t.dim()};
  for (int64_t d = 0; d < t.dim(); ++d) words.push_back(t.size(d));
  words.resize(kWords, 0);
  return words;
}

std::string kind_text(const std::vector<int64_t>& words) {
  std::string text = dtype_name(static_cast<c10::ScalarType>(words[0])) + " [";
  for (int64_t d = 0; d < words[1]; ++d) text += (d ? ", " : "") + std::to_string(words[2 + d]);
  return text + "]";
}

// The tag of tie t's gradients to its first copy (or from it).
int gradient_tag(size_t t, bool from_first) {
  return tag_of(ControlTag::kTiedGradients) + 2 * static_cast<int>(t) + (from_first ? 1 : 0);
}

}  // namespace

void TiedParameters::agree() {
  for (TiedCopies& tie : ties_) {
    const auto& stages = tie.stages;
    // Row i: the kind of stage stages[i]'s copies, filled by the rank that holds it.
    torch::Tensor kinds =
        torch::zeros({static_cast<int64_t>(stages.size()), kWords}, torch::kInt64);
    for (const auto& [stage, tensor] : tie.local) {
      const auto row = std::find(stages.begin(), stages.end(), stage) - stages.begin();
      const auto words = kind_of(tensor, tie.name);
      const torch::Tensor own = torch::tensor(words, torch::kInt64);
      const bool filled = kinds[row].abs().sum().item<int64_t>() != 0;
      PPTRAIN_CHECK(!filled || torch::equal(kinds[row], own), "tied parameter '", tie.name,
                    "' has two copies of different shapes on stage ", stage, ": ", kind_text(words),
                    " and another");
      kinds[row].copy_(own);
    }
    if (tie.group) tie.group->allreduce_sum(kinds);
    for (size_t i = 1; i < stages.size(); ++i) {
      PPTRAIN_CHECK(torch::equal(kinds[static_cast<int64_t>(i)], kinds[0]), "tied parameter '",
                    tie.name, "' is ",
                    kind_text(std::vector<int64_t>(kinds[0].data_ptr<int64_t>(),
                                                   kinds[0].data_ptr<int64_t>() + kWords)),
                    " on stage ", stages[0], " but ",
                    kind_text(std::vector<int64_t>(
                        kinds[static_cast<int64_t>(i)].data_ptr<int64_t>(),
                        kinds[static_cast<int64_t>(i)].data_ptr<int64_t>() + kWords)),
                    " on stage ", stages[i]);
    }
    // The first copy's values, to everyone: the others add zeros to it, which leaves it exact.
    torch::NoGradGuard no_grad;
    const torch::Tensor& first = tie.local.front().second;
    torch::Tensor values = tie.local.front().first == stages.front() ? first.detach().clone()
                                                                     : torch::zeros_like(first);
    if (tie.group) tie.group->allreduce_sum(values);
    for (auto& [stage, tensor] : tie.local) tensor.copy_(values);
  }
}

void TiedParameters::agree_state(const std::vector<StageOptimizer*>& optimizers) {
  torch::NoGradGuard no_grad;
  const auto holder = [&optimizers](const torch::Tensor& p) -> StageOptimizer* {
    for (StageOptimizer* o : optimizers) {
      if (o->holds(p)) return o;
    }
    return nullptr;
  };
  for (TiedCopies& tie : ties_) {
    // The first copy's state, if this rank holds it; the others add zeros (as agree() does).
    const auto& [stage, first] = tie.local.front();
    StageOptimizer* first_optimizer = stage == tie.stages.front() ? holder(first) : nullptr;
    std::vector<torch::Tensor> state =
        first_optimizer ? first_optimizer->state_of(first) : std::vector<torch::Tensor>{};
    auto has_state = torch::full({1}, state.empty() ? 0 : 1, torch::kInt64);
    if (tie.group) tie.group->allreduce_sum(has_state);
    if (has_state.item<int64_t>() == 0) continue;  // a fresh optimizer: nothing to agree on
    StageOptimizer* any = holder(first);
    PPTRAIN_ASSERT(any, "tied parameter '", tie.name, "': no optimizer holds this rank's copy");
    if (state.empty()) {
      state = any->state_like(first);
    } else {
      for (auto& t : state) t = t.clone();
    }
    for (auto& t : state) {
      if (tie.group) tie.group->allreduce_sum(t);
    }
    for (const auto& [s, copy] : tie.local) {
      if (StageOptimizer* o = holder(copy)) o->set_state(copy, state);
    }
  }
}

void TiedParameters::sum_gradients() {
  for (TiedCopies& tie : ties_) {
    torch::Tensor sum;
    std::vector<const c10::TensorImpl*> seen;  // a copy listed twice is one tensor
    for (const auto& [stage, tensor] : tie.local) {
      if (std::count(seen.begin(), seen.end(), tensor.unsafeGetTensorImpl())) continue;
      seen.push_back(tensor.unsafeGetTensorImpl());
      if (!tensor.grad().defined()) continue;
      sum = sum.defined() ? sum + tensor.grad() : tensor.grad().clone();
    }
    if (!sum.defined()) sum = torch::zeros_like(tie.local.front().second);
    if (tie.group) tie.group->allreduce_sum(sum);
    for (auto& [stage, tensor] : tie.local) {
      if (tensor.grad().defined()) {
        tensor.mutable_grad().copy_(sum);
      } else {
        tensor.mutable_grad() = sum.clone();
      }
    }
  }
}

bool TiedParameters::is_extra_copy(const torch::Tensor& tensor) const {
  for (const TiedCopies& tie : ties_) {
    for (size_t i = 0; i < tie.local.size(); ++i) {
      if (!tie.local[i].second.is_same(tensor)) continue;
      return !(i == 0 && tie.local[i].first == tie.stages.front());
    }
  }
  return false;
}

std::vector<torch::Tensor> TiedParameters::copies_on(size_t t, int stage) const {
  std::vector<torch::Tensor> out;
  for (const auto& [s, tensor] : ties_[t].local) {
    if (s != stage) continue;
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const torch::Tensor& o) { return o.is_same(tensor); });
    if (!seen) out.push_back(tensor);
  }
  return out;
}

void TiedParameters::use_asynchronously(const OptimizerOptions& optimizer, int lag,
                                        std::function<double(int update)> rate) {
  PPTRAIN_ASSERT(lag >= 1, "a follower applies an update after it was taken");
  optimizer_ = &optimizer;
  lag_ = lag;
  rate_ = std::move(rate);
  for (size_t t = 0; t < ties_.size(); ++t) {
    for (const auto& [stage, tensor] : ties_[t].local) {
      if (stage == ties_[t].stages.front() || followers_.count({t, stage})) continue;
      Follower& follower = followers_[{t, stage}];
      follower.copies = copies_on(t, stage);
      follower.optimizer = make_torch_optimizer(optimizer, follower.copies);
    }
  }
}

void TiedParameters::deliver(size_t t, int from, int to, int update, torch::Tensor gradient) {
  const TiedCopies& tie = ties_[t];
  const auto index = [&tie](int stage) {
    return std::find(tie.stages.begin(), tie.stages.end(), stage) - tie.stages.begin();
  };
  const bool local = std::any_of(tie.local.begin(), tie.local.end(),
                                 [to](const auto& copy) { return copy.first == to; });
  if (local) {
    local_mail_[{t, from, to, update}] = std::move(gradient);
    return;
  }
  const int peer = tie.ranks[index(to)];
  sends_.emplace_back(update, tie.group->send(gradient.contiguous(), peer,
                                              gradient_tag(t, from == tie.stages.front())));
}

torch::Tensor TiedParameters::collect(size_t t, int from, int to, int update,
                                      const torch::Tensor& like) {
  const TiedCopies& tie = ties_[t];
  const auto found = local_mail_.find({t, from, to, update});
  if (found != local_mail_.end()) {
    torch::Tensor gradient = std::move(found->second);
    local_mail_.erase(found);
    return gradient;
  }
  const auto at = std::find(tie.stages.begin(), tie.stages.end(), from) - tie.stages.begin();
  const bool local = std::any_of(tie.local.begin(), tie.local.end(),
                                 [from](const auto& copy) { return copy.first == from; });
  PPTRAIN_ASSERT(!local && tie.group, "tied parameter '", tie.name, "': stage ", to,
                 " needs update ", update, " of stage ", from, " before it was taken");
  torch::Tensor gradient = torch::empty_like(like, at::MemoryFormat::Contiguous);
  tie.group->recv(gradient, tie.ranks[at], gradient_tag(t, from == tie.stages.front())).wait();
  return gradient;
}

void TiedParameters::before_async_step(int stage, int update) {
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedCopies& tie = ties_[t];
    const std::vector<torch::Tensor> here = copies_on(t, stage);
    if (here.empty()) continue;
    torch::Tensor sum = torch::zeros_like(here.front());
    for (const auto& copy : here) {
      if (copy.grad().defined()) sum += copy.grad();
    }
    if (stage == tie.stages.front()) {
      for (size_t i = 1; i < tie.stages.size(); ++i) {
        sum += collect(t, tie.stages[i], stage, update, sum);
      }
      for (const auto& copy : here) copy.mutable_grad() = sum.clone();
    } else {
      deliver(t, stage, tie.stages.front(), update, sum);
      for (const auto& copy : here) copy.mutable_grad() = torch::Tensor();
    }
  }
}

void TiedParameters::after_async_step(int stage, int update, bool stepped) {
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedCopies& tie = ties_[t];
    const std::vector<torch::Tensor> here = copies_on(t, stage);
    if (here.empty()) continue;
    if (stage == tie.stages.front()) {
      // What the copy applied (clipped); not finite when the stage skipped the update.
      const torch::Tensor applied =
          stepped ? here.front().grad().detach().clone() : torch::full_like(here.front(), NAN);
      for (size_t i = 1; i < tie.stages.size(); ++i) {
        deliver(t, stage, tie.stages[i], update, applied);
      }
    } else {
      if (update >= lag_) apply_update(t, stage, update - lag_);
      for (const auto& copy : here) copy.mutable_grad() = torch::zeros_like(copy);
    }
  }
  // A send is waited on once its receiver has surely taken it (2 lags on).
  while (!sends_.empty() && sends_.front().first < update - 2 * lag_) {
    sends_.front().second.wait();
    sends_.pop_front();
  }
}

void TiedParameters::apply_update(size_t t, int stage, int update) {
  Follower& follower = followers_.at({t, stage});
  const torch::Tensor gradient =
      collect(t, ties_[t].stages.front(), stage, update, follower.copies.front());
  if (!torch::isfinite(gradient).all().item<bool>()) return;  // the first copy skipped it
  for (const auto& copy : follower.copies) copy.mutable_grad() = gradient.clone();
  set_learning_rate(*follower.optimizer, rate_(update));
  follower.optimizer->step();
}

void TiedParameters::finish_async(int last_update) {
  torch::NoGradGuard no_grad;
  // The first copies send their values, which each follower checks once it has caught up: the
  // rule makes them equal bit for bit, and a run that broke it must not pass for one that kept
  // it (update -1 marks the message).
  for (size_t t = 0; t < ties_.size(); ++t) {
    const std::vector<torch::Tensor> first = copies_on(t, ties_[t].stages.front());
    if (first.empty()) continue;
    for (size_t i = 1; i < ties_[t].stages.size(); ++i) {
      deliver(t, ties_[t].stages.front(), ties_[t].stages[i], -1, first.front().detach().clone());
    }
  }
  for (auto& [key, follower] : followers_) {
    const auto [t, stage] = key;
    for (int u = std::max(0, last_update - lag_ + 1); u <= last_update; ++u) {
      apply_update(t, stage, u);
    }
    for (const auto& copy : follower.copies) copy.mutable_grad() = torch::zeros_like(copy);
    const torch::Tensor first =
        collect(t, ties_[t].stages.front(), stage, -1, follower.copies.front());
    for (const auto& copy : follower.copies) {
      PPTRAIN_ASSERT(torch::equal(copy, first), "tied parameter '", ties_[t].name,
                     "': the copy on stage ", stage, " differs from the first after the run");
    }
  }
  for (auto& [update, send] : sends_) send.wait();
  sends_.clear();
}

}  // namespace pptrain
