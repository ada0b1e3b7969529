// What the autograd split of a backward into I and W costs against one fused backward, on the
// stage of a tutorial-shaped transformer (torch::nn::TransformerDecoderLayer blocks, no
// dropout), one compute thread:
//
//   fused       one backward from the stage's output (B)
//   two passes  I: autograd::grad to the input, graph kept; W: backward from the output again
//               to the parameters (pptrain's split before models/autograd_split.h)
//   split       models/autograd_split.h: input_backward, then run_weight_pass
//
// The three alternate within each round, each after its own forward; medians of the rounds.
//
//   cmake --build build --target bench_split_backward
//   ./build/bench/bench_split_backward [--rounds 30] [--layers 2] [--d-model 256] [--heads 4]
//       [--seq 128] [--microbatch 2]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "pptrain/models/autograd_split.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Flags {
  int rounds = 30, layers = 2, d_model = 256, heads = 4, seq = 128, microbatch = 2;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_split_backward: %s needs a value\n", name.c_str());
      std::exit(2);
    }
    const int value = std::atoi(argv[++i]);
    if (name == "--rounds")
      f.rounds = value;
    else if (name == "--layers")
      f.layers = value;
    else if (name == "--d-model")
      f.d_model = value;
    else if (name == "--heads")
      f.heads = value;
    else if (name == "--seq")
      f.seq = value;
    else if (name == "--microbatch")
      f.microbatch = value;
    else {
      std::fprintf(stderr, "bench_split_backward: unknown flag %s\n", name.c_str());
      std::exit(2);
    }
    if (value <= 0) {
      std::fprintf(stderr, "bench_split_backward: %s must be > 0\n", name.c_str());
      std::exit(2);
    }
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  torch::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::ModuleList blocks;
  for (int l = 0; l < f.layers; ++l) {
    blocks->push_back(torch::nn::TransformerDecoderLayer(
        torch::nn::TransformerDecoderLayerOptions(f.d_model, f.heads)
            .dim_feedforward(4 * f.d_model)
            .dropout(0.0)));
  }
  const std::vector<torch::Tensor> params = blocks->parameters();
  // [seq, microbatch, d_model] -> the same; each block attends to its own input as memory.
  const auto stage = [&](const torch::Tensor& x) {
    torch::Tensor y = x;
    for (const auto& block : *blocks) {
      y = block->as<torch::nn::TransformerDecoderLayer>()->forward(y, y);
    }
    return y;
  };
  struct Way {
    const char* name;
    std::function<void(const torch::Tensor& out, const torch::Tensor& grad, torch::Tensor& x)> run;
    std::vector<double> backward_s = {};
  };
  std::vector<Way> ways = {
      {"fused", [](const torch::Tensor& out, const torch::Tensor& g,
                   torch::Tensor&) { torch::autograd::backward({out}, {g}); }},
      {"two passes",
       [&](const torch::Tensor& out, const torch::Tensor& g, torch::Tensor& x) {
         x.mutable_grad() = torch::autograd::grad({out}, {x}, {g}, /*retain_graph=*/true)[0];
         torch::autograd::backward({out}, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                   params);
       }},
      {"split",
       [&](const torch::Tensor& out, const torch::Tensor& g, torch::Tensor& x) {
         pptrain::WeightPass weight;
         x.mutable_grad() = pptrain::input_backward({out}, {g}, {x}, weight)[0];
         pptrain::run_weight_pass(weight, params);
       }},
  };
  const int warmup = 3;
  for (int round = 0; round < warmup + f.rounds; ++round) {
    for (Way& way : ways) {
      torch::Tensor x = torch::randn({f.seq, f.microbatch, f.d_model}).requires_grad_(true);
      const torch::Tensor out = stage(x);
      const torch::Tensor grad = torch::randn_like(out);
      const auto start = Clock::now();
      way.run(out, grad, x);
      if (round >= warmup) way.backward_s.push_back(seconds_since(start));
      for (const auto& p : params) p.mutable_grad() = torch::Tensor();
    }
  }
  std::printf(
      "%d TransformerDecoderLayer(d_model %d, heads %d, ff %d), input [%d, %d, %d], "
      "one thread, median of %d rounds\n",
      f.layers, f.d_model, f.heads, 4 * f.d_model, f.seq, f.microbatch, f.d_model, f.rounds);
  const double fused = median(ways[0].backward_s);
  for (const Way& way : ways) {
    const double s = median(way.backward_s);
    std::printf("%-11s backward %7.2f ms   %.2fx fused\n", way.name, s * 1e3, s / fused);
  }
  return 0;
}
