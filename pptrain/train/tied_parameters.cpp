#include "pptrain/train/tied_parameters.h"

#include <algorithm>

#include "pptrain/common/check.h"
#include "pptrain/models/tensor_bundle.h"

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

}  // namespace pptrain
