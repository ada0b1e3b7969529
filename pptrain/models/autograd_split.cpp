#include "pptrain/models/autograd_split.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <unordered_map>
#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

namespace ag = torch::autograd;

ag::Edge edge_of(const torch::Tensor& t) {
  if (t.grad_fn()) return ag::Edge(t.grad_fn(), t.output_nr());
  return ag::Edge(ag::impl::try_get_grad_accumulator(t), 0);  // none if no graph uses the leaf
}

// The backward graph below `roots`: each node it reaches, and whether one of `leaves` lies
// below it (the node is on the path of the inputs' gradients).
class GraphBelow {
 public:
  GraphBelow(const ag::edge_list& roots, const ag::edge_list& leaves) {
    for (const ag::Edge& leaf : leaves) on_input_path_[leaf.function.get()] = true;
    for (const ag::Edge& root : roots) visit(root.function);
  }

  bool on_input_path(const ag::Node* node) const { return on_input_path_.at(node); }

  // The nodes on the inputs' path with an edge that leaves it (towards parameters).
  const std::vector<std::shared_ptr<ag::Node>>& splits() const { return splits_; }

 private:
  // Depth first, without recursion: a stage of many layers is a deep graph.
  void visit(const std::shared_ptr<ag::Node>& root) {
    if (on_input_path_.count(root.get())) return;
    struct Frame {
      std::shared_ptr<ag::Node> node;
      size_t next_edge = 0;
    };
    std::vector<Frame> stack{{root}};
    on_input_path_[root.get()] = false;
    while (!stack.empty()) {
      Frame& frame = stack.back();
      if (frame.next_edge < frame.node->num_outputs()) {
        const ag::Edge& edge = frame.node->next_edge(frame.next_edge++);
        if (edge.is_valid() && !on_input_path_.count(edge.function.get())) {
          on_input_path_[edge.function.get()] = false;
          stack.push_back({edge.function});
        }
        continue;
      }
      // All below is known: the node is on the path if a child is, and splits if another is not.
      bool any_on = false, any_off = false;
      for (const ag::Edge& edge : frame.node->next_edges()) {
        if (!edge.is_valid()) continue;
        (on_input_path_.at(edge.function.get()) ? any_on : any_off) = true;
      }
      ag::Node* node = frame.node.get();
      if (any_on) {
        on_input_path_[node] = true;
        if (any_off) splits_.push_back(frame.node);
      }
      stack.pop_back();
    }
  }

  std::unordered_map<const ag::Node*, bool> on_input_path_;
  std::vector<std::shared_ptr<ag::Node>> splits_;
};

}  // namespace

std::vector<torch::Tensor> input_backward(const std::vector<torch::Tensor>& outputs,
                                          const std::vector<torch::Tensor>& output_grads,
                                          const std::vector<torch::Tensor>& inputs,
                                          WeightPass& weight) {
  PPTRAIN_ASSERT(weight.empty(), "input_backward into a weight pass that has not run");
  PPTRAIN_ASSERT(output_grads.empty() || output_grads.size() == outputs.size(),
                 "input_backward: ", outputs.size(), " outputs but ", output_grads.size(),
                 " gradients");
  ag::edge_list roots;
  std::vector<torch::Tensor> root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    ag::Edge edge = ag::impl::gradient_edge(outputs[i]);
    if (!edge.is_valid()) continue;  // an output that needs no gradient
    roots.push_back(std::move(edge));
    root_grads.push_back(output_grads.empty() ? torch::ones_like(outputs[i]) : output_grads[i]);
  }
  // The inputs the graph uses; an unused one gets no gradient.
  ag::edge_list leaves;
  std::vector<size_t> leaf_of_input(inputs.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    PPTRAIN_ASSERT(inputs[i].is_leaf() && inputs[i].requires_grad(), "input_backward: input ", i,
                   " is not a leaf that requires a gradient");
    ag::Edge edge = edge_of(inputs[i]);
    if (!edge.is_valid()) continue;
    leaf_of_input[i] = leaves.size();
    leaves.push_back(std::move(edge));
  }
  const GraphBelow graph(roots, leaves);
  // I's outputs: the inputs' gradients, then every gradient that reaches a split node.
  ag::edge_list wanted = leaves;
  for (const auto& split : graph.splits()) {
    for (uint32_t k = 0; k < split->num_inputs(); ++k) wanted.emplace_back(split, k);
  }
  const std::vector<torch::Tensor> grads =
      leaves.empty() ? std::vector<torch::Tensor>()
                     : ag::Engine::get_default_engine().execute(
                           roots, root_grads, /*keep_graph=*/true, /*create_graph=*/false,
                           /*accumulate_grad=*/false, wanted);
  std::vector<torch::Tensor> input_grads(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (leaf_of_input[i] < leaves.size()) input_grads[i] = grads[leaf_of_input[i]];
  }
  // W starts at the split nodes, with what reached them, and at the outputs off the inputs'
  // path. Cutting the split nodes' edges into that path (I has run it) keeps W off it.
  for (size_t w = leaves.size(); w < wanted.size(); ++w) {
    if (!grads[w].defined()) continue;
    weight.roots.push_back(wanted[w]);
    weight.grads.push_back(grads[w]);
  }
  for (size_t i = 0; i < roots.size(); ++i) {
    if (graph.on_input_path(roots[i].function.get())) continue;
    weight.roots.push_back(roots[i]);
    weight.grads.push_back(root_grads[i]);
  }
  for (const auto& split : graph.splits()) {
    for (ag::Edge& edge : split->next_edges()) {
      if (edge.is_valid() && graph.on_input_path(edge.function.get())) edge = ag::Edge();
    }
  }
  return input_grads;
}

void run_weight_pass(WeightPass& weight, const std::vector<torch::Tensor>& parameters) {
  WeightPass pass = std::move(weight);  // empty even if the pass throws
  weight = WeightPass();
  ag::edge_list wanted;
  for (const torch::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    ag::Edge edge = edge_of(p);
    if (edge.is_valid()) wanted.push_back(std::move(edge));
  }
  if (pass.empty() || wanted.empty()) return;
  ag::Engine::get_default_engine().execute(pass.roots, pass.grads, /*keep_graph=*/false,
                                           /*create_graph=*/false, /*accumulate_grad=*/true,
                                           wanted);
}

}  // namespace pptrain
