// Parameters that several stages share: GPT's token embedding on the first stage and its output
// head on the last (weight tying). Each stage keeps its own copy; the copies start equal, their
// gradients are summed over every copy before the optimizer step (one all-reduce over the ranks
// that hold them), and every copy then takes the same step, so they stay equal bit for bit:
// what one shared tensor in one process computes.
//
//   TiedCopies embedding{"embedding", {0, 7}, {{0, token_table}}, group.view};
//   TiedParameters tied({embedding});
//   tied.agree();            // before training: same shapes everywhere, the first stage's values
//   ...the step's backwards...
//   tied.sum_gradients();    // then clip and step as usual
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "pptrain/runtime/transport.h"

namespace pptrain {

// One shared parameter as one rank sees it.
struct TiedCopies {
  std::string name;
  std::vector<int> stages;  // every stage that holds a copy, ascending
  // This rank's copies: (stage, tensor), in stage order; a stage may hold several (a one-process
  // run holds the embedding and the head in one stage).
  std::vector<std::pair<int, torch::Tensor>> local;
  // The ranks holding copies, this one among them; null when this rank holds them all.
  Transport* group = nullptr;
};

class TiedParameters {
 public:
  TiedParameters() = default;
  explicit TiedParameters(std::vector<TiedCopies> ties) : ties_(std::move(ties)) {}

  bool empty() const { return ties_.empty(); }
  // A collective over each tie's group. UserError naming the tie and the two stages when copies
  // differ in shape or dtype; then every copy takes the values of the copy on the lowest stage.
  void agree();
  // Every copy's gradient becomes the sum of all copies' gradients (undefined ones count as 0).
  void sum_gradients();
  // Whether `tensor` is a copy other than the first of its tie: the gradient norm counts a tied
  // parameter once.
  bool is_extra_copy(const torch::Tensor& tensor) const;

 private:
  std::vector<TiedCopies> ties_;
};

}  // namespace pptrain
