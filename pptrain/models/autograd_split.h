// The split of a backward into I and W that autograd makes for any module (zero-bubble
// schedules on stages that are not made of PipeLinear layers).
//
// I runs the backward from a stage's outputs to its inputs only. Some nodes on that path also
// lead to parameters (a linear layer's matmul, a norm): I keeps the gradient that reached each
// of them and cuts their edges back into the input's path, so that W runs those nodes once more,
// from the kept gradients, for their parameter edges only. Each weight gradient is computed once
// and no gradient of the input's path twice, as in one fused backward; W never reruns what I ran.
// The rest of the graph (attention, activations: the nodes that lead to the input alone) is
// freed once the caller drops the outputs after I.
//
//   WeightPass weight;
//   auto input_grads = input_backward(outputs, output_grads, inputs, weight);   // I
//   ...
//   run_weight_pass(weight, parameters);   // W: accumulates into each parameter's grad
//
// Activation hooks on a node that leads to both (a tensor hook on a linear layer's input
// gradient) run in I and again in W, each time on the gradient that reached the node.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/torch.h>

#include <vector>

namespace pptrain {

// What I leaves for W: the graph's entry points for the weight gradients, with their gradients.
struct WeightPass {
  torch::autograd::edge_list roots;
  std::vector<torch::Tensor> grads;  // one per root
  bool empty() const { return roots.empty(); }
};

// I: the gradients of `inputs` (leaves with requires_grad: a stage's inputs; undefined for one
// the outputs do not depend on), from `outputs` with gradients `output_grads` (empty: ones, for
// a scalar loss). Fills `weight` with what run_weight_pass needs; the graph is kept for it.
std::vector<torch::Tensor> input_backward(const std::vector<torch::Tensor>& outputs,
                                          const std::vector<torch::Tensor>& output_grads,
                                          const std::vector<torch::Tensor>& inputs,
                                          WeightPass& weight);

// W: accumulates the gradients of `parameters` (those that require one) from `weight` into
// their grad, frees what the pass held and empties it.
void run_weight_pass(WeightPass& weight, const std::vector<torch::Tensor>& parameters);

}  // namespace pptrain
