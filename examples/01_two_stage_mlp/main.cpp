// The smallest pipeline: a 6-module MLP cut into one stage per rank, trained with GPipe.
//   pptrain run --nproc 2 ./two_stage_mlp     (alone, ./two_stage_mlp is one rank, one stage)
#include <pptrain/api/pipeline.h>

#include <cstdio>
#include <vector>

int main() {
  pptrain::World world = pptrain::init_from_env();  // RANK, WORLD_SIZE, ... as torchrun sets
  torch::manual_seed(0);  // every rank builds the same model and data, then keeps its part
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 16), torch::nn::Tanh());
  const torch::Tensor x = torch::randn({32, 16}), y = x.flip(1).sin();
  std::vector<int> cuts;  // stage p starts at module 6p/P
  for (int p = 1; p < world.size; ++p) cuts.push_back(6 * p / world.size);
  auto parts = pptrain::split_sequential(model, cuts);
  pptrain::PipelineStage stage(parts[world.rank], world.rank, world.size);

  pptrain::PipelineOptions options;
  options.schedule = "gpipe";
  options.microbatches = 4;
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  pptrain::PipelineSchedule schedule(world, {&stage}, options, mse);
  torch::optim::SGD optimizer(stage.parameters(), /*lr=*/0.1);
  for (int step = 1; step <= 5; ++step) {
    optimizer.zero_grad();
    const torch::Tensor loss = schedule.step(x, y);  // defined on the last stage's rank
    optimizer.step();
    if (loss.defined()) std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
}
