// Example 01's program with 1f1b, started by hand on several hosts as torchrun would start it:
// every rank gets RANK, WORLD_SIZE, MASTER_ADDR (rank 0's host) and MASTER_PORT. See README.md.
#include <pptrain/api/pipeline.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

int main() {
  pptrain::World world = pptrain::init_from_env();
  char host[256] = "?";
  gethostname(host, sizeof host);
  std::printf("rank %d of %d on %s\n", world.rank, world.size, host);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 16), torch::nn::Tanh());
  const torch::Tensor x = torch::randn({32, 16}), y = x.flip(1).sin();
  std::vector<int> cuts;
  for (int p = 1; p < world.size; ++p) cuts.push_back(6 * p / world.size);
  auto parts = pptrain::split_sequential(model, cuts);
  pptrain::PipelineStage stage(parts[world.rank], world.rank, world.size);
  pptrain::PipelineOptions options;  // 1f1b
  options.microbatches = 4;
  auto mse = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  pptrain::PipelineSchedule schedule(world, {&stage}, options, mse);
  torch::optim::SGD optimizer(stage.parameters(), 0.1);
  for (int step = 1; step <= 5; ++step) {
    optimizer.zero_grad();
    const torch::Tensor loss = schedule.step(x, y);
    optimizer.step();
    if (loss.defined()) std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
}
