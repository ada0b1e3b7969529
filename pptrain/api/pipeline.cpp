#include "pptrain/api/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/device/memory.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/train/report.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// A boundary's shape travels as a fixed-size float64 message: its rank, then its sizes.
constexpr int kMaxDims = 8;

std::vector<torch::nn::AnyModule> modules_of(const torch::nn::Sequential& part) {
  std::vector<torch::nn::AnyModule> out;
  for (const auto& module : *part) out.push_back(module);
  return out;
}

ValidatedSchedule make_validated(const PipelineOptions& options, int ranks) {
  if (!options.schedule_file.empty()) {
    Schedule imported =
        parse_csv(read_text_file(options.schedule_file, "schedule file"), options.schedule_file);
    PPTRAIN_CHECK(imported.num_ranks == ranks, "the schedule file ", options.schedule_file,
                  " is for ", imported.num_ranks, " ranks, the world has ", ranks);
    PPTRAIN_CHECK(imported.num_microbatches == options.microbatches, "the schedule file ",
                  options.schedule_file, " has ", imported.num_microbatches,
                  " microbatches, the options say ", options.microbatches);
    ValidatedSchedule schedule = validate(imported);
    PPTRAIN_CHECK(!schedule->replicated(), "the schedule file ", options.schedule_file,
                  " runs replicas of its stages, which the library does not offer yet");
    return schedule;
  }
  const ScheduleEntry& entry = find_schedule(options.schedule);
  PPTRAIN_CHECK(entry.update == WeightUpdate::kFlush && !entry.averages_copies, "schedule '",
                options.schedule,
                "' is asynchronous: it steps the optimizer inside the schedule, which the "
                "library does not offer yet (use a synchronous schedule, or pptrain train)");
  check_schedule_size(ranks, resolve_chunks(entry, options.chunks), options.microbatches,
                      "microbatches");
  ValidatedSchedule schedule =
      validate(make_schedule({options.schedule, ranks, options.microbatches, options.chunks}));
  PPTRAIN_CHECK(!schedule->replicated(), "schedule '", options.schedule,
                "' runs replicas of its stages, whose gradients must be summed between ranks, "
                "which the library does not offer yet (use pptrain train for it)");
  return schedule;
}

// The M microbatches of a batch, split along dimension 0; none for an undefined batch.
std::vector<torch::Tensor> split_batch(const torch::Tensor& batch, int microbatches,
                                       const char* what) {
  if (!batch.defined()) return {};
  PPTRAIN_CHECK(batch.dim() >= 1 && batch.size(0) % microbatches == 0, "the ", what, " batch has ",
                batch.dim() >= 1 ? batch.size(0) : 0, " rows, which do not split into ",
                microbatches, " equal microbatches");
  return batch.split(batch.size(0) / microbatches);
}

}  // namespace

StagePlacement place_stages(const World& world, const PipelineOptions& options) {
  const ValidatedSchedule schedule = make_validated(options, world.size);
  return {schedule->num_stages, schedule->stages_of(world.rank)};
}

World init_from_env() {
  World world;
  if (std::getenv("RANK") == nullptr) {
    world.transport = std::move(make_loopback_transports(1)[0]);
    return world;
  }
  const TransportOptions options = TransportOptions::from_env();
  world.rank = options.rank;
  world.size = options.world_size;
  world.transport = connect_transport(options);
  return world;
}

std::vector<torch::nn::Sequential> split_sequential(const torch::nn::Sequential& model,
                                                    const std::vector<int>& split_points) {
  const int size = static_cast<int>(model->size());
  std::vector<int> bounds = {0};
  for (int point : split_points) {
    PPTRAIN_CHECK(point > bounds.back() && point < size, "split point ", point,
                  " is not in ascending order within 1..", size - 1);
    bounds.push_back(point);
  }
  bounds.push_back(size);
  const std::vector<torch::nn::AnyModule> modules = modules_of(model);
  std::vector<torch::nn::Sequential> parts;
  for (size_t p = 0; p + 1 < bounds.size(); ++p) {
    torch::nn::Sequential part;
    for (int i = bounds[p]; i < bounds[p + 1]; ++i) {
      part->push_back(std::to_string(i), modules[i]);  // named as in the whole model
    }
    parts.push_back(part);
  }
  return parts;
}

PipelineStage::PipelineStage(torch::nn::Sequential module, int stage_index, int num_stages)
    : stage_(stage_index, 0, modules_of(module)), num_stages_(num_stages) {
  PPTRAIN_CHECK(stage_index >= 0 && stage_index < num_stages, "stage index ", stage_index,
                " is not in 0..", num_stages - 1);
}

PipelineStage::PipelineStage(torch::nn::AnyModule module, int stage_index, int num_stages)
    : stage_(stage_index, 0, {std::move(module)}), num_stages_(num_stages) {
  PPTRAIN_CHECK(stage_index >= 0 && stage_index < num_stages, "stage index ", stage_index,
                " is not in 0..", num_stages - 1);
}

struct PipelineSchedule::Impl {
  Impl(World w, std::vector<PipelineStage*> s, PipelineOptions o, LossFn l)
      : world(std::move(w)),
        stages(std::move(s)),
        options(std::move(o)),
        loss(std::move(l)),
        run(make_validated(options, world.size)) {}

  World world;
  std::vector<PipelineStage*> stages;
  PipelineOptions options;
  LossFn loss;
  RunInfo run;
  std::optional<Executor> executor;  // made at the first step, once the boundary shapes are known
  int steps_done = 0;
  bool finished = false;
  int64_t weight_bytes = 0;  // of this rank's stages' parameters: the same every step

  const Schedule& schedule() const { return *run.schedule; }

  PipelineStage* local(int index) const {
    for (PipelineStage* stage : stages) {
      if (stage->index() == index) return stage;
    }
    return nullptr;
  }

  // The shape of every cut, found by running each stage on the first microbatch, stage by stage:
  // the rank that runs stage b on microbatch 0 computes cut b's shape, and one all-reduce hands it
  // to every rank (each needs all of them, for the buffers of its receives).
  std::vector<std::vector<int64_t>> boundary_shapes(const std::vector<torch::Tensor>& inputs) {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<int64_t> input_shape;
    for (int b = 0; b + 1 < schedule().num_stages; ++b) {
      auto message = torch::zeros({kMaxDims + 1}, torch::kFloat64);
      if (schedule().rank_of(b, 0) == world.rank) {
        PipelineStage* stage = local(b);
        PPTRAIN_ASSERT(stage, "rank ", world.rank, " runs stage ", b, " but does not hold it");
        PPTRAIN_CHECK(b > 0 || !inputs.empty(), "rank ", world.rank,
                      " holds the first stage but step() was given no inputs");
        const torch::Tensor input = b == 0 ? inputs[0] : torch::zeros(input_shape);
        const torch::Tensor output = probe(*stage, input);
        PPTRAIN_CHECK(output.scalar_type() == torch::kFloat32, "stage ", b,
                      " outputs a tensor of type ", c10::toString(output.scalar_type()),
                      "; what crosses a cut between stages must be float32");
        PPTRAIN_CHECK(output.dim() <= kMaxDims, "stage ", b, " outputs a tensor of ", output.dim(),
                      " dimensions; at most ", kMaxDims, " cross a cut");
        message[0] = static_cast<double>(output.dim());
        for (int64_t d = 0; d < output.dim(); ++d) {
          message[d + 1] = static_cast<double>(output.size(d));
        }
      }
      if (world.size > 1) world.transport->allreduce_sum(message);
      input_shape.assign(static_cast<size_t>(message[0].item<double>()), 0);
      for (size_t d = 0; d < input_shape.size(); ++d) {
        input_shape[d] = static_cast<int64_t>(message[d + 1].item<double>());
      }
      shapes.push_back(input_shape);
    }
    return shapes;
  }

  // The stage's output for `input`, in eval mode and without autograd, leaving its modules'
  // training flags as they were.
  static torch::Tensor probe(PipelineStage& stage, const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<torch::nn::Module*, bool>> flags;
    for (const auto& module : stage.stage().modules()) {
      flags.emplace_back(module.get(), module->is_training());
      module->eval();
    }
    torch::Tensor output = stage.stage().forward(input);
    for (auto& [module, training] : flags) module->train(training);
    return output;
  }

  void start(const std::vector<torch::Tensor>& inputs, const torch::Tensor& batch) {
    install_counting_allocator();
    ExecutorOptions executor_options;
    executor_options.rank = world.rank;
    for (PipelineStage* stage : stages) executor_options.stages.push_back(&stage->stage());
    executor_options.transport = world.transport.get();
    executor_options.loss = loss;
    executor_options.boundary_shapes = boundary_shapes(inputs);
    executor_options.recompute = options.recompute;
    executor_options.weight_split = options.weight_split;
    executor.emplace(run.schedule, std::move(executor_options));
    for (PipelineStage* stage : stages) {
      for (const auto& p : stage->parameters()) weight_bytes += tensor_bytes(p);
    }
    run.microbatches = schedule().num_microbatches;
    run.steps = options.steps;
    run.tokens_per_sample = options.tokens_per_sample;
    run.batch_size = batch.defined() ? batch.size(0) : 0;
    run.header = "pipeline of " + std::to_string(schedule().num_stages) + " stages with " +
                 schedule().name + ": " + std::to_string(world.size) + " rank" +
                 (world.size == 1 ? "" : "s") + ", " + std::to_string(run.microbatches) +
                 " microbatches";
    if (world.rank == 0) {
      for (StepObserver* o : options.observers) o->on_start(run);
    }
  }
};

PipelineSchedule::PipelineSchedule(World world, std::vector<PipelineStage*> stages,
                                   PipelineOptions options, LossFn loss)
    : impl_(std::make_unique<Impl>(std::move(world), std::move(stages), std::move(options),
                                   std::move(loss))) {
  const Schedule& s = impl_->schedule();
  std::vector<int> given;
  for (PipelineStage* stage : impl_->stages) {
    PPTRAIN_CHECK(stage != nullptr, "a null stage was given");
    PPTRAIN_CHECK(stage->num_stages() == s.num_stages, "stage ", stage->index(), " is one of ",
                  stage->num_stages(), " stages, but ", s.name, " on ", s.num_ranks, " ranks has ",
                  s.num_stages);
    given.push_back(stage->index());
  }
  std::sort(given.begin(), given.end());
  const std::vector<int> expected = s.stages_of(impl_->world.rank);
  auto list = [](const std::vector<int>& v) {
    std::string text;
    for (int x : v) text += (text.empty() ? "" : ", ") + std::to_string(x);
    return text.empty() ? std::string("none") : text;
  };
  PPTRAIN_CHECK(given == expected, s.name, " puts stages ", list(expected), " on rank ",
                impl_->world.rank, ", but it was given stages ", list(given));
  PPTRAIN_CHECK(impl_->loss || !std::count(given.begin(), given.end(), s.num_stages - 1),
                "the rank of the last stage needs a loss function");
}

PipelineSchedule::~PipelineSchedule() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() explicitly to see the error
  }
}

const Schedule& PipelineSchedule::schedule() const {
  return impl_->schedule();
}

torch::Tensor PipelineSchedule::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  Impl& impl = *impl_;
  const int M = impl.schedule().num_microbatches;
  StepData data;
  data.inputs = split_batch(inputs, M, "input");
  data.targets = split_batch(targets, M, "target");
  const int rank = impl.world.rank;
  for (int end : {0, impl.schedule().num_stages - 1}) {
    const auto holders = impl.schedule().replicas_of(end);
    const bool holds = std::count(holders.begin(), holders.end(), rank) > 0;
    PPTRAIN_CHECK(!holds || !(end == 0 ? data.inputs : data.targets).empty(), "rank ", rank,
                  " holds the ", end == 0 ? "first" : "last", " stage but step() was given no ",
                  end == 0 ? "inputs" : "targets");
  }
  if (!impl.executor) impl.start(data.inputs, inputs.defined() ? inputs : targets);
  Transport& transport = *impl.world.transport;
  transport.barrier();  // a common start, so the ranks' timelines line up
  const auto start = Clock::now();
  const int64_t base_bytes = allocated_bytes();
  reset_peak();
  StepRecord record = impl.executor->run_step(data, start);
  RankStep mine;
  mine.peak_activation_bytes = peak_bytes() - base_bytes;
  mine.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  mine.start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
  mine.has_loss = record.has_loss;
  mine.loss = record.loss;
  mine.bytes_sent = record.bytes_sent;
  mine.compute_s = record.compute_cpu_s;
  mine.weight_bytes = impl.weight_bytes;
  mine.events = std::move(record.events);
  const auto report = gather_step_report(impl.run, impl.steps_done, 0, mine, transport);
  ++impl.steps_done;
  if (report) {
    for (StepObserver* o : impl.options.observers) o->on_step(*report);
  }
  if (!record.has_loss) return torch::Tensor();
  return torch::tensor(record.loss, torch::kFloat64);
}

void PipelineSchedule::finish() {
  Impl& impl = *impl_;
  if (impl.finished) return;
  impl.finished = true;
  if (impl.world.rank != 0 || !impl.executor) return;
  for (StepObserver* o : impl.options.observers) o->on_end(impl.run);
}

}  // namespace pptrain
