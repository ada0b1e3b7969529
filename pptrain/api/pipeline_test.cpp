#include "pptrain/api/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pptrain/api/testing.h"
#include "pptrain/common/check.h"
#include "pptrain/runtime/loopback_transport.h"

namespace pptrain {
namespace {

// A model of the program's own, in plain torch::nn modules (no PipeLinear): LayerNorm and
// Linear layers, so every stage has weights for W and inputs for I.
// Ranks are threads here and torch's global generator is shared: whoever seeds it and draws
// from it holds this.
std::mutex seeding;

torch::nn::Sequential own_model(int blocks) {
  std::lock_guard<std::mutex> lock(seeding);
  torch::manual_seed(7);
  torch::nn::Sequential model;
  for (int b = 0; b < blocks; ++b) {
    model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})));
    model->push_back(torch::nn::Linear(12, 12));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

// The same kind of model as layer factories, each layer seeded by its own index, so any split
// builds the same weights.
std::vector<LayerFactory> own_layers(int blocks) {
  std::vector<LayerFactory> layers;
  for (int i = 0; i < 3 * blocks; ++i) {
    layers.push_back([i]() -> torch::nn::AnyModule {
      std::lock_guard<std::mutex> lock(seeding);
      torch::manual_seed(1000 + i);
      if (i % 3 == 0)
        return torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})));
      if (i % 3 == 1) return torch::nn::AnyModule(torch::nn::Linear(12, 12));
      return torch::nn::AnyModule(torch::nn::Tanh());
    });
  }
  return layers;
}

torch::nn::Sequential whole_model(const std::vector<LayerFactory>& layers) {
  torch::nn::Sequential model;
  for (const auto& make : layers) model->push_back(make());
  return model;
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

using Result = testing::Trained;
using testing::expect_equal;

constexpr int kSteps = 3;
constexpr int kBatch = 8;

torch::Tensor random_batch(uint64_t seed) {
  return torch::randn({kBatch, 12}, at::detail::createCPUGenerator(seed));
}
torch::Tensor batch_inputs(int step) {
  return random_batch(100 + step);
}
torch::Tensor batch_targets(int step) {
  return random_batch(200 + step);
}

// One process, no pipeline: the whole mini-batch through the whole model, plain SGD.
Result plain_training(torch::nn::Sequential model, int microbatches) {
  // The mean of the microbatches' means, as a pipeline computes it.
  return testing::train_in_one_process(
      model->parameters(), kSteps, microbatches, [&](int k, int m) {
        const auto inputs = batch_inputs(k).split(kBatch / microbatches);
        const auto targets = batch_targets(k).split(kBatch / microbatches);
        return mse(model->forward(inputs[m]), targets[m]);
      });
}
Result plain_training(int blocks, int microbatches) {
  return plain_training(own_model(blocks), microbatches);
}

// The same model cut into stages and trained through the library, ranks as threads of this
// process. Every rank builds the whole model from the same seed and keeps its parts. With
// options.optimizer pptrain steps the optimizer (and reads the batches from a source); without
// it the program's SGD does. With data_parallel D each copy of the pipeline gets its 1/D of the
// batch. The losses are each copy's summed over the ranks that return one (a replicated last
// stage returns a share), averaged over the copies; the weights are each stage's on the first
// rank holding it, and every other holder must hold the same.
// With `factories`, each rank builds only its stages' layers from them, cut evenly.
Result pipelined_training(int ranks, int blocks, PipelineOptions options,
                          const std::vector<LayerFactory>* factories = nullptr) {
  auto transports = make_loopback_transports(ranks);
  const int copies = std::max(options.data_parallel, 1);
  std::vector<std::vector<double>> losses(ranks);                             // [rank][step]
  std::vector<std::vector<std::vector<torch::Tensor>>> stage_weights(ranks);  // [rank][stage]
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        World world{r, ranks, std::move(transports[r])};
        const StagePlacement placement = place_stages(world, options);
        auto model = own_model(blocks);
        const int per_stage = static_cast<int>(model->size()) / placement.num_stages;
        std::vector<int> cuts;
        for (int s = 1; s < placement.num_stages; ++s) cuts.push_back(s * per_stage);
        auto parts = split_sequential(model, cuts);
        std::vector<PipelineStage> stages;
        stages.reserve(placement.local.size());
        for (int s : placement.local) {
          if (factories) {
            stages.emplace_back(*factories, cuts, s);
          } else {
            stages.emplace_back(parts[s], s, placement.num_stages);
          }
        }
        std::vector<PipelineStage*> pointers;
        std::vector<torch::Tensor> params;
        for (auto& stage : stages) {
          pointers.push_back(&stage);
          for (auto& p : stage.parameters()) params.push_back(p);
        }
        PipelineSchedule schedule(world, pointers, options, mse);
        const int copy = r / (ranks / copies);
        const auto share = [copy, copies](const torch::Tensor& t) {
          return t.narrow(0, copy * (kBatch / copies), kBatch / copies);
        };
        const BatchSource batches = [&share](int step) {
          return Batch{share(batch_inputs(step)), share(batch_targets(step))};
        };
        torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
        for (int step = 0; step < kSteps; ++step) {
          torch::Tensor loss;
          if (options.optimizer) {
            loss = schedule.step(batches);
          } else {
            optimizer.zero_grad();
            loss = schedule.step(share(batch_inputs(step)), share(batch_targets(step)));
            optimizer.step();
          }
          if (loss.defined()) losses[r].push_back(loss.item<double>());
        }
        schedule.finish();
        stage_weights[r].resize(placement.num_stages);
        for (auto& stage : stages) {
          for (auto& p : stage.parameters()) {
            stage_weights[r][stage.index()].push_back(p.detach().clone());
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
        std::abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  Result merged;
  merged.losses.assign(kSteps, 0);
  for (const auto& rank_losses : losses) {
    if (rank_losses.empty()) continue;
    EXPECT_EQ(rank_losses.size(), static_cast<size_t>(kSteps));
    for (size_t k = 0; k < rank_losses.size() && k < kSteps; ++k) {
      merged.losses[k] += rank_losses[k] / copies;
    }
  }
  const int num_stages = static_cast<int>(stage_weights[0].size());
  for (int s = 0; s < num_stages; ++s) {
    const std::vector<torch::Tensor>* first = nullptr;
    for (int r = 0; r < ranks; ++r) {
      const auto& held = stage_weights[r][s];
      if (held.empty()) continue;
      if (!first) {
        first = &held;
        continue;
      }
      for (size_t i = 0; i < held.size(); ++i) {
        EXPECT_TRUE(torch::equal(held[i], (*first)[i])) << "stage " << s << " on rank " << r;
      }
    }
    if (first) merged.weights.insert(merged.weights.end(), first->begin(), first->end());
  }
  return merged;
}

TEST(Pipeline, OwnModelEqualsPlainTrainingOnEverySynchronousSchedule) {
  for (int ranks : {2, 4}) {
    for (std::string name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"}) {
      for (auto split : {ExecutorOptions::WeightSplit::kAutograd,
                         ExecutorOptions::WeightSplit::kDeferredLayers}) {
        PipelineOptions options;
        options.schedule = name;
        options.microbatches = 4;
        options.weight_split = split;
        const std::string what =
            name + " on " + std::to_string(ranks) + " ranks, " +
            (split == ExecutorOptions::WeightSplit::kAutograd ? "autograd" : "fused");
        expect_equal(pipelined_training(ranks, 8, options), plain_training(8, 4), what);
      }
    }
  }
}

TEST(Pipeline, OwnModelEqualsPlainTrainingOnTheGeneratorsAndReplicatedSchedules) {
  // The automatic and V-shaped schedules, with the microbatches they need (dualpipev: 2P), and
  // the replicated ones: each replica of a stage runs some of the microbatches, and their
  // gradients are summed.
  for (int ranks : {2, 4}) {
    for (std::string name : {"zb-auto", "v-half", "v-min", "dualpipev", "chimera", "gems"}) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 8;
      expect_equal(pipelined_training(ranks, 8, options), plain_training(8, 8),
                   name + " on " + std::to_string(ranks) + " ranks");
    }
  }
}

// options.optimizer: pptrain zeroes the gradients, clips and steps, and the program only calls
// step(). Plain SGD with clipping off is what plain_training() runs.
TEST(Pipeline, PptrainStepsTheOptimizerAsTheProgramWould) {
  OptimizerOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0;
  for (int ranks : {2, 4}) {
    for (std::string name : {"1f1b", "zb-v"}) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 4;
      options.optimizer = sgd;
      expect_equal(pipelined_training(ranks, 8, options), plain_training(8, 4),
                   name + " on " + std::to_string(ranks) + " ranks, pptrain's optimizer");
    }
  }
  // Two copies of a 2-rank pipeline, each on half the batch in 2 microbatches: the same 4
  // microbatches of the same batch.
  PipelineOptions options;
  options.schedule = "1f1b";
  options.microbatches = 2;
  options.data_parallel = 2;
  options.optimizer = sgd;
  expect_equal(pipelined_training(4, 8, options), plain_training(8, 4), "1f1b, 2 x 2 copies");
}

// A model given as layer factories: each rank builds only its layers, numbered as in the whole
// model, which ZeRO 1 needs to share the optimizer state out over the copies.
TEST(Pipeline, LayerFactoriesBuildOnlyTheRanksLayers) {
  const std::vector<LayerFactory> layers = own_layers(8);
  PipelineStage third(layers, {6, 12, 18}, 2);
  EXPECT_EQ(third.stage().first_layer(), 12);
  EXPECT_EQ(third.stage().num_layers(), 6);
  EXPECT_EQ(third.num_stages(), 4);
  for (std::string name : {"1f1b", "zb-v"}) {
    PipelineOptions options;
    options.schedule = name;
    options.microbatches = 4;
    expect_equal(pipelined_training(4, 8, options, &layers), plain_training(whole_model(layers), 4),
                 name + " from layer factories");
  }
  PipelineOptions options;
  options.schedule = "1f1b";
  options.microbatches = 2;
  options.data_parallel = 2;
  options.zero = 1;
  options.optimizer = OptimizerOptions{"sgd", 0.1, /*momentum=*/0};
  expect_equal(pipelined_training(4, 8, options, &layers), plain_training(whole_model(layers), 4),
               "1f1b, 2 x 2 copies, zero 1");
}

// An asynchronous schedule on a program's model: the pipeline equals its own one-process rule
// (serial_reference) and not synchronous training.
TEST(Pipeline, AsynchronousSchedulesEqualTheirOneProcessRule) {
  OptimizerOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0;
  for (int ranks : {2, 4}) {
    for (std::string name : {"pipedream", "2bw", "pipemare"}) {
      PipelineOptions options;
      options.schedule = name;
      options.microbatches = 4;
      options.steps = kSteps;
      options.optimizer = sgd;
      const std::string what = name + " on " + std::to_string(ranks) + " ranks";
      const Result pipelined = pipelined_training(ranks, 8, options);
      PipelineOptions serial = options;
      serial.planned = serial_reference(options, ranks);
      expect_equal(pipelined, pipelined_training(1, 8, serial), what);
      double most = 0;  // from synchronous training
      const Result synchronous = plain_training(8, 4);
      for (size_t i = 0; i < synchronous.weights.size(); ++i) {
        most = std::max(most,
                        (pipelined.weights[i] - synchronous.weights[i]).abs().max().item<double>());
      }
      EXPECT_GT(most, 1e-4) << what << " trained as synchronous training does";
    }
  }
}

TEST(Pipeline, AutogradSplitWithRecomputationEqualsPlainTraining) {
  // I reruns the forward, keeps that graph for W: the weights' gradients come from the rerun.
  PipelineOptions options;
  options.schedule = "zb-h1";
  options.microbatches = 2;
  options.recompute = true;
  expect_equal(pipelined_training(2, 4, options), plain_training(4, 2), "zb-h1 recompute");
}

// The step reports reach a program's observers: one per step on rank 0, with the loss the last
// rank returned and every rank's events; finish() makes the trace writer write.
TEST(Pipeline, ObserversGetEveryStepsReport) {
  struct Counter : StepObserver {
    int started = 0, ended = 0;
    std::vector<StepReport> reports;
    void on_start(const RunInfo&) override { ++started; }
    void on_step(const StepReport& report) override { reports.push_back(report); }
    void on_end(const RunInfo&) override { ++ended; }
  };
  const std::string trace = ::testing::TempDir() + "pipeline_test_trace.json";
  std::remove(trace.c_str());
  Counter counter;
  TraceWriter writer(trace);
  auto transports = make_loopback_transports(2);
  std::vector<double> losses;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      World world{r, 2, std::move(transports[r])};
      auto parts = split_sequential(own_model(2), {3});
      PipelineStage stage(parts[r], r, 2);
      PipelineOptions options;
      options.schedule = "zb-h1";
      options.microbatches = 2;
      options.steps = kSteps;
      if (r == 0) options.observers = {&counter, &writer};
      PipelineSchedule schedule(world, {&stage}, options, mse);
      for (int step = 0; step < kSteps; ++step) {
        auto loss = schedule.step(batch_inputs(step), batch_targets(step));
        if (loss.defined()) losses.push_back(loss.item<double>());
      }
      schedule.finish();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter.started, 1);
  EXPECT_EQ(counter.ended, 1);
  ASSERT_EQ(counter.reports.size(), static_cast<size_t>(kSteps));
  for (int k = 0; k < kSteps; ++k) {
    const StepReport& report = counter.reports[k];
    EXPECT_EQ(report.step, k + 1);
    EXPECT_EQ(report.steps, kSteps);
    EXPECT_DOUBLE_EQ(report.loss, losses[k]);
    EXPECT_EQ(report.timeline.num_ranks, 2);
    // zb-h1 on 2 ranks, M = 2: each rank runs F, I and W twice, and the sends and receives.
    for (int rank = 0; rank < 2; ++rank) {
      const auto compute = std::count_if(
          report.timeline.events.begin(), report.timeline.events.end(),
          [rank](const auto& e) { return e.rank == rank && is_compute(e.action.op); });
      EXPECT_EQ(compute, 6) << "rank " << rank << ", step " << k + 1;
    }
  }
  std::ifstream written(trace);
  EXPECT_TRUE(written.good()) << trace;
}

TEST(Pipeline, RefusesWhatItCannotRun) {
  auto transports = make_loopback_transports(1);
  World world{0, 1, std::move(transports[0])};
  auto parts = split_sequential(own_model(2), {3});
  PipelineStage first(parts[0], 0, 2);
  PipelineOptions options;
  options.schedule = "pipedream";  // asynchronous: needs options.optimizer (and steps)
  options.steps = 2;
  EXPECT_THROW((PipelineSchedule{world, {&first}, options, mse}), UserError);
  options.optimizer = OptimizerOptions{};
  options.steps = 0;
  EXPECT_THROW((PipelineSchedule{world, {&first}, options, mse}), UserError);
  options.optimizer.reset();
  options.schedule = "no-such-schedule";
  EXPECT_THROW((PipelineSchedule{world, {&first}, options, mse}), UserError);
  options.schedule = "1f1b";  // one rank, one stage: stage 0 of 1, not of 2
  EXPECT_THROW((PipelineSchedule{world, {&first}, options, mse}), UserError);
  EXPECT_THROW(split_sequential(own_model(2), {4, 2}), UserError);
  EXPECT_THROW((PipelineStage{parts[1], 2, 2}), UserError);
  // A batch that does not split into the microbatches.
  PipelineStage whole(own_model(1), 0, 1);
  options.microbatches = 3;
  PipelineSchedule schedule(world, {&whole}, options, mse);
  EXPECT_THROW(schedule.step(torch::zeros({8, 12}), torch::zeros({8, 12})), UserError);
}

}  // namespace
}  // namespace pptrain
