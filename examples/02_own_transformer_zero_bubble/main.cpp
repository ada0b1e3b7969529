// A transformer of the program's own (not pptrain's gpt), trained with a zero-bubble schedule.
//
//   pptrain run --nproc 2 ./own_transformer --schedule zb-v            # I/W split by autograd
//   pptrain run --nproc 2 ./own_transformer --schedule zb-v --fused    # I runs the whole backward
//   ./own_transformer                                                 # one rank, one stage
//
// The model: an input projection, N pre-norm blocks (causal self-attention and an MLP), and an
// output projection, regressing a shifted copy of a random sequence. It is cut into as many
// stages as the schedule wants (zb-v: two per rank, placed in a V), each rank keeping its own.
#include <pptrain/api/pipeline.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// One pre-norm transformer block: x + attention(LN(x)), then + MLP(LN(.)). Causal, one head
// group of `heads` heads. Input and output [batch, sequence, width].
struct BlockImpl : torch::nn::Module {
  BlockImpl(int width, int heads)
      : heads(heads),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), w = x.size(2), d = w / heads;
    auto parts = qkv(norm1(x)).view({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(double(d));
    auto future = torch::ones({t, t}, torch::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    auto attended = torch::matmul(scores.softmax(-1), parts[2]).transpose(1, 2).reshape({b, t, w});
    x = x + proj(attended);
    return x + down(torch::gelu(up(norm2(x))));
  }

  int heads;
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

int main(int argc, char** argv) {
  std::string schedule_name = "zb-v";
  bool fused = false;
  int steps = 4;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--schedule") == 0 && i + 1 < argc) {
      schedule_name = argv[++i];
    } else if (std::strcmp(argv[i], "--fused") == 0) {
      fused = true;
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--schedule NAME] [--fused] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  pptrain::World world = pptrain::init_from_env();
  pptrain::PipelineOptions options;
  options.schedule = world.size == 1 ? "1f1b" : schedule_name;
  options.microbatches = 8;
  options.weight_split = fused ? pptrain::ExecutorOptions::WeightSplit::kDeferredLayers
                               : pptrain::ExecutorOptions::WeightSplit::kAutograd;
  const pptrain::StagePlacement placement = pptrain::place_stages(world, options);

  // Every rank builds the same model from one seed: projection in, 8 blocks, projection out.
  const int width = 32, blocks = 8;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(8, width));
  for (int i = 0; i < blocks; ++i) model->push_back(Block(width, 4));
  model->push_back(torch::nn::Linear(width, 8));
  // Blocks spread evenly over the stages; the projections go with the first and last.
  std::vector<int> cuts;
  for (int s = 1; s < placement.num_stages; ++s)
    cuts.push_back(1 + s * blocks / placement.num_stages);
  auto parts = pptrain::split_sequential(model, cuts);
  std::vector<pptrain::PipelineStage> stages;
  std::vector<pptrain::PipelineStage*> mine;
  std::vector<torch::Tensor> params;
  stages.reserve(placement.local.size());
  for (int s : placement.local) {
    stages.emplace_back(parts[s], s, placement.num_stages);
    mine.push_back(&stages.back());
    for (const auto& p : stages.back().parameters()) params.push_back(p);
  }
  auto mse = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  pptrain::PipelineSchedule schedule(world, mine, options, mse);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
  for (int step = 1; step <= steps; ++step) {
    const torch::Tensor x = torch::randn({16, 12, 8});  // the same on every rank (same seed)
    const torch::Tensor y = x.roll(1, 1);               // the sequence shifted by one
    optimizer.zero_grad();
    const torch::Tensor loss = schedule.step(x, y);
    optimizer.step();
    if (loss.defined()) std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
}
