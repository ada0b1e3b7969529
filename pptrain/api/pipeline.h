// pptrain as a library: pipeline-parallel training of a program's own torch::nn model.
//
// Shaped after torch.distributed.pipelining (PipelineStage, a schedule object, step()), with
// every schedule of pptrain's registry, the zero-bubble ones included, on any module:
//
//   pptrain::World world = pptrain::init_from_env();      // RANK, WORLD_SIZE, ... as torchrun
//   torch::manual_seed(0);                                // every rank builds the same model
//   torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::GELU(),
//                               torch::nn::Linear(64, 16));
//   auto parts = pptrain::split_sequential(model, {2});   // [0, 2) and [2, 3)
//   pptrain::PipelineStage stage(parts[world.rank], world.rank, 2);
//   pptrain::PipelineSchedule schedule(world, {&stage}, {"zb-h1", /*microbatches=*/4},
//       [](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); });
//   torch::optim::SGD optimizer(stage.parameters(), 0.1);
//   optimizer.zero_grad();
//   torch::Tensor loss = schedule.step(x, y);  // the loss on the last stage's rank, else undefined
//   optimizer.step();
//
// step() splits the batch along dimension 0 into the microbatches, runs this rank's part of the
// schedule and returns with the mini-batch mean's gradients accumulated in the stage's
// parameters, as torch's step() does; the program's own optimizer steps them. Every rank calls
// step() with the same batch (only the first stage's rank reads `inputs`, only the last
// stage's rank reads `targets`; the others may pass undefined tensors).
//
// What crosses a cut between stages is one float32 tensor per microbatch. Its shape is found on
// the first step by running each stage once on the first microbatch (the modules in eval mode,
// without autograd) and passing the shape along the pipeline; it must stay the same afterwards.
//
// Zero-bubble schedules split each backward into I (input gradient) and W (weight gradients).
// For any module the split is made through autograd (ExecutorOptions::WeightSplit::kAutograd);
// pptrain's PipeLinear layers defer their W themselves (`weight_split`).
//
// Asynchronous schedules (pipedream, 2bw, ...) step the optimizer between microbatches, inside
// the schedule: they are not offered here yet, and naming one is a UserError.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/observers.h"

namespace pptrain {

// This process among the ranks of the run.
struct World {
  int rank = 0;
  int size = 1;
  // How the ranks reach each other (a c10d process group with pptrain's timeouts; a loopback
  // for a one-process world).
  std::shared_ptr<Transport> transport;
};

// Joins the run described by torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (LOCAL_RANK is not needed on CPU). Without RANK, a world of one process.
// Every receive and collective fails after PPTRAIN_COMM_TIMEOUT_S seconds (default 60) without
// an answer, naming the peer, instead of hanging. UserError on a malformed environment.
World init_from_env();

// Cuts a Sequential before each of `split_points` (ascending, in 1 .. size-1): {2, 5} makes
// [0, 2), [2, 5), [5, size). The parts share the modules (and parameters) of `model`.
std::vector<torch::nn::Sequential> split_sequential(const torch::nn::Sequential& model,
                                                    const std::vector<int>& split_points);

// One stage of the pipeline, held by the rank that runs it: a module (a Sequential part, or a
// module the program built for this stage) whose forward takes one tensor and returns one.
class PipelineStage {
 public:
  template <typename ModuleHolder>
  PipelineStage(ModuleHolder module, int stage_index, int num_stages)
      : PipelineStage(torch::nn::AnyModule(std::move(module)), stage_index, num_stages) {}
  // A Sequential's modules become the stage's layers, run in order.
  PipelineStage(torch::nn::Sequential module, int stage_index, int num_stages);
  PipelineStage(torch::nn::AnyModule module, int stage_index, int num_stages);

  int index() const { return stage_.index(); }
  int num_stages() const { return num_stages_; }
  std::vector<torch::Tensor> parameters() const { return stage_.parameters(); }
  // The runtime's view of it (what the executor runs).
  Stage& stage() { return stage_; }

 private:
  Stage stage_;
  int num_stages_;
};

struct PipelineOptions {
  // A schedule of the registry (`pptrain schedule --list`), e.g. "gpipe", "1f1b", "zb-h1",
  // "zb-v", "interleaved-1f1b"; or, with `schedule_file`, a CSV in torch's format.
  std::string schedule = "1f1b";
  int microbatches = 1;       // M: the batch is split into this many along dimension 0
  int chunks = 0;             // stages per rank; 0: the schedule's default
  std::string schedule_file;  // a schedule CSV (docs/SCHEDULE_FORMAT.md); wins over `schedule`
  // I/W split for zero-bubble schedules: kAutograd works for any module; kDeferredLayers only
  // splits pptrain's PipeLinear layers (others compute their weight gradients in I).
  ExecutorOptions::WeightSplit weight_split = ExecutorOptions::WeightSplit::kAutograd;
  // Keep only each stage's input between F and its backward; rerun F first.
  bool recompute = false;
  // Observers of every step's report (loss, times, peak memory, the measured timeline), on
  // rank 0; not owned. finish() ends them (writes the trace, the SVG).
  std::vector<StepObserver*> observers;
  // For the reports: the run's length (0: unknown) and the tokens in one sample.
  int steps = 0;
  double tokens_per_sample = 1;
};

// Which stages the schedule of `options` puts on this rank, and how many there are in all: the
// parts of the model the rank builds. 1f1b on 2 ranks: stage r of 2 on rank r; zb-v on 2 ranks:
// stages 0 and 3 of 4 on rank 0, 1 and 2 on rank 1.
struct StagePlacement {
  int num_stages = 1;
  std::vector<int> local;  // ascending
};
StagePlacement place_stages(const World& world, const PipelineOptions& options);

// A schedule running this rank's stages. Every rank makes one with the same options (a mismatch
// fails at the first step with a communication error naming the peer).
class PipelineSchedule {
 public:
  // `stages`: this rank's stages of the schedule (one, or several with interleaving or a V
  // placement); not owned, they must outlive the schedule. `loss`: of one microbatch, a mean over
  // its elements, on the last stage's rank. UserError for an unknown or asynchronous schedule,
  // or stages that are not those the schedule puts on this rank.
  PipelineSchedule(World world, std::vector<PipelineStage*> stages, PipelineOptions options,
                   LossFn loss);
  ~PipelineSchedule();
  PipelineSchedule(const PipelineSchedule&) = delete;
  PipelineSchedule& operator=(const PipelineSchedule&) = delete;

  // One training step on a mini-batch; see the top of this file. Returns the mean loss over the
  // microbatches (a float64 scalar, without autograd) on the rank that holds the last stage, an
  // undefined tensor elsewhere.
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& targets);
  // Tells the observers the run is over. Called by the destructor if not before.
  void finish();

  // The lowered schedule every rank runs (with its SEND and RECV actions).
  const Schedule& schedule() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pptrain
