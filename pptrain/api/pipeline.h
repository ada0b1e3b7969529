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
// What crosses a cut between stages is a TensorBundle (models/tensor_bundle.h): one tensor, or
// a list or a string-keyed map of tensors of any dtype and shape. A stage's module takes one
// tensor and returns one, or takes a `const TensorBundle&` and returns a TensorBundle (found at
// compile time). Floating-point tensors carry gradients back; ids and masks go forward only.
// Every message tells its tensors' shapes, so the shapes may change from batch to batch (a
// sequence length per batch); their names and dtypes may not. The inputs and targets given to
// step() may be bundles too: the first stage takes the inputs, the loss the targets.
//
// Zero-bubble schedules split each backward into I (input gradient) and W (weight gradients).
// For any module the split is made through autograd (ExecutorOptions::WeightSplit::kAutograd);
// pptrain's PipeLinear layers defer their W themselves (`weight_split`).
//
// With `PipelineOptions::optimizer` set, pptrain steps the optimizer itself: step() clips the
// global gradient norm and steps every stage (zeroing the gradients first), so the program
// only calls step(). Asynchronous schedules (pipedream, 2bw, pipemare, ...) need it: they step
// each stage between microbatches, on weight versions, and their first stage runs ahead into
// later steps' microbatches, so step() takes a batch source instead of one batch:
//
//   options.optimizer = pptrain::OptimizerOptions{"sgd", /*lr=*/0.05};
//   options.steps = 100;                                  // an asynchronous run's length
//   schedule.step([&](int step) { return pptrain::Batch{x[step], y[step]}; });
//
// Data parallelism (`data_parallel` D) runs D copies of the pipeline on D x P ranks; each
// copy's ranks pass step() their copy's share of the batch. Replicated schedules (chimera,
// gems) sum their replicas' gradients. `pptrain train` is itself a program on this API
// (job/trainer.h).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pptrain/common/precision.h"
#include "pptrain/models/tensor_bundle.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/loss_scale.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/optimizer.h"
#include "pptrain/train/report.h"

namespace pptrain {

// This process among the ranks of the run.
struct World {
  int rank = 0;
  int size = 1;
  // How the ranks reach each other (a c10d process group with pptrain's timeouts; a loopback
  // for a one-process world).
  std::shared_ptr<Transport> transport;
};

// Joins the run its launcher describes (runtime/cluster_env.h): torchrun's RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT (LOCAL_RANK is not needed on CPU); srun's SLURM_PROCID, SLURM_NTASKS
// and first host of SLURM_JOB_NODELIST; mpirun's OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE with
// MASTER_ADDR. Under Slurm or MPI, rank 0 prints one line naming the launcher. Without any, a
// world of one process.
// Every receive and collective fails after PPTRAIN_COMM_TIMEOUT_S seconds (default 60) without
// an answer, naming the peer, instead of hanging. UserError on a malformed environment.
World init_from_env();

// Cuts a Sequential before each of `split_points` (ascending, in 1 .. size-1): {2, 5} makes
// [0, 2), [2, 5), [5, size). The parts share the modules (and parameters) of `model`.
std::vector<torch::nn::Sequential> split_sequential(const torch::nn::Sequential& model,
                                                    const std::vector<int>& split_points);

// A model given as one factory per layer, instead of a whole model: a rank builds only the
// layers of the stages it holds, so it never holds the whole model. For the same weights under
// any split, each factory seeds its own layer (e.g. torch::manual_seed(i) first).
using LayerFactory = std::function<torch::nn::AnyModule()>;

namespace detail {
// Whether ModuleHolder's module has `TensorBundle forward(const TensorBundle&)`.
template <typename ModuleHolder, typename = void>
struct ForwardsBundle : std::false_type {};
template <typename ModuleHolder>
struct ForwardsBundle<ModuleHolder, std::void_t<decltype(std::declval<ModuleHolder&>()->forward(
                                        std::declval<const TensorBundle&>()))>>
    : std::is_same<decltype(std::declval<ModuleHolder&>()->forward(
                       std::declval<const TensorBundle&>())),
                   TensorBundle> {};
}  // namespace detail

// One stage of the pipeline, held by the rank that runs it: a module (a Sequential part, or a
// module the program built for this stage) whose forward takes one tensor and returns one, or
// takes a `const TensorBundle&` and returns a TensorBundle.
class PipelineStage {
 public:
  template <typename ModuleHolder>
  PipelineStage(ModuleHolder module, int stage_index, int num_stages)
      : PipelineStage(torch::nn::AnyModule(std::move(module)), stage_index, num_stages,
                      detail::ForwardsBundle<ModuleHolder>::value) {}
  // A Sequential's modules become the stage's layers, run in order (each on one tensor).
  PipelineStage(torch::nn::Sequential module, int stage_index, int num_stages);
  // `takes_bundle`: the module's forward takes and returns a TensorBundle.
  PipelineStage(torch::nn::AnyModule module, int stage_index, int num_stages,
                bool takes_bundle = false);
  // Stage `stage_index` of a model given as layer factories, cut before each of
  // `split_points` (as split_sequential): only that stage's layers are built, numbered as in
  // the whole model.
  PipelineStage(const std::vector<LayerFactory>& layers, const std::vector<int>& split_points,
                int stage_index);
  // A runtime Stage (pptrain's own layers: models/model.h's make_stage), and how to build
  // another of the same layers.
  PipelineStage(Stage stage, int num_stages, std::function<Stage()> make_copy);

  int index() const { return stage_.index(); }
  int num_stages() const { return num_stages_; }
  std::vector<torch::Tensor> parameters() const { return stage_.parameters(); }
  // The runtime's view of it (what the executor runs).
  Stage& stage() { return stage_; }
  // Declares `parameter` (one of this stage's) a copy of the shared parameter `name`, which
  // PipelineOptions::tied lists with the stages holding it (GPT's token embedding on the first
  // stage, its output head on the last). A stage may tie several of its tensors to one name.
  void tie(const std::string& name, torch::Tensor parameter);
  const std::vector<std::pair<std::string, torch::Tensor>>& ties() const { return ties_; }
  // This stage (not the first) also takes these tensors of the batch's inputs (a named bundle:
  // ids, masks), beside what the previous stage sends it (then a named bundle too), so they need
  // not pass through the stages before it. The rank holding it reads the batch.
  void take_from_batch(std::vector<std::string> names);
  const std::vector<std::string>& batch_inputs() const { return batch_inputs_; }
  // At a bf16 or fp16 precision (PipelineOptions::precision), these tensors of this stage's
  // output (a named bundle) keep their dtype where the stage's other float32 outputs are cast
  // to the compute dtype: a float32 bias or scale the next stage needs in full precision.
  void keep_dtype(std::vector<std::string> names) { kept_dtype_ = std::move(names); }
  const std::vector<std::string>& kept_dtype() const { return kept_dtype_; }
  // Another Stage of the same layers (any values): what an asynchronous schedule keeps its
  // weight versions in. A clone of the modules, so they must be torch::nn::Cloneable (every
  // torch module is); UserError otherwise.
  Stage copy() const;

 private:
  Stage stage_;
  int num_stages_;
  std::function<Stage()> make_copy_;
  std::vector<std::pair<std::string, torch::Tensor>> ties_;
  std::vector<std::string> batch_inputs_;
  std::vector<std::string> kept_dtype_;
};

// TiedParameter (a parameter shared between stages) is planner/run_request.h's.

// A schedule made and validated already, with the rule of its weight versions: what
// `pptrain train` hands the library (its --pp 1 reference, PipeDream's round robin from a
// partition, a solved zb-auto, ...).
struct PlannedSchedule {
  ValidatedSchedule schedule;
  VersionRule weights;
  // avgpipe: the data-parallel copies combine no gradients but pull their weights together
  // every few steps (PipelineOptions::family: --avg-interval, --avg-alpha).
  bool averages = false;
};

struct PipelineOptions {
  // A schedule of the registry (`pptrain schedule --list`), e.g. "gpipe", "1f1b", "zb-h1",
  // "zb-v", "interleaved-1f1b"; or, with `schedule_file`, a CSV in torch's format.
  std::string schedule = "1f1b";
  int microbatches = 1;       // M: the batch is split into this many along dimension 0
  int chunks = 0;             // stages per rank; 0: the schedule's default
  std::string schedule_file;  // a schedule CSV (docs/SCHEDULE_FORMAT.md); wins over `schedule`
  std::optional<PlannedSchedule> planned;  // wins over both
  // I/W split for zero-bubble schedules: kAutograd works for any module; kDeferredLayers only
  // splits pptrain's PipeLinear layers (others compute their weight gradients in I).
  ExecutorOptions::WeightSplit weight_split = ExecutorOptions::WeightSplit::kAutograd;
  // Keep only each stage's input between F and its backward; rerun F first.
  bool recompute = false;
  // D: copies of the pipeline. World rank w runs pipeline rank w % P of copy w / P; a stage's
  // D copies average their gradients before the optimizer step.
  int data_parallel = 1;
  // With data_parallel D: the samples of each step's batch each copy trains on, [copy] (copy
  // d's ranks pass step() that many rows; partition/workers.h: data-parallel shares), each a
  // multiple of `microbatches`. A copy's gradients then weigh its share of their sum, so the
  // step is the mean over the whole batch; a copy holding slower ranks may take fewer. Empty:
  // equal shares, averaged.
  std::vector<int> data_parallel_shares;
  // 1: each copy keeps the optimizer state of about 1/D of the layers (ZeRO stage 1); needs
  // `optimizer` and stages whose layer numbers do not overlap (pptrain's own layers).
  int zero = 0;
  // Set: pptrain steps the optimizer (see the top of this file). Unset: step() leaves the
  // gradients to the program's optimizer.
  std::optional<OptimizerOptions> optimizer;
  // Parameters shared between stages (unreplicated schedules: synchronous, pipedream, 2bw);
  // a stage below 0 counts from the last ({0, -1}: the first stage and the last).
  std::vector<TiedParameter> tied;
  // The precision the stages compute in (common/precision.h). bf16 and fp16: every forward runs
  // under autocast to it, the activations between layers and so the messages between stages
  // are in it (Stage::forward), the loss is taken in float32; parameters, gradients and the
  // optimizer's state stay float32 (master weights). fp16 also scales the loss (`loss_scale`,
  // train/loss_scale.h) and skips a step whose gradients overflowed on any rank, on every rank:
  // it needs `optimizer` (pptrain must be the one to skip) and a synchronous schedule.
  Precision precision = Precision::kFp32;
  // bf16 and fp16 on a synchronous schedule: cast each weight once per step, the copy shared by
  // all the step's microbatches (ExecutorOptions::casts_per_step), instead of at each use.
  bool casts_per_step = false;
  LossScaleOptions loss_scale;
  // Where this rank's stages compute (device/placement.h): set, they are moved there (their
  // parameters keep their identity, as Module::to keeps it); unset, the device their modules are
  // on (all the same; a module without tensors goes anywhere). The batch's microbatches are moved
  // there; messages between ranks cross through host memory.
  std::optional<torch::Device> device;
  // Skip connections (synchronous schedules): the tensor `name` of stage `from`'s output (a
  // named bundle) goes straight to stage `to` > `from`, beside what stage to - 1 sends it, and
  // its gradient straight back; the stages between never see it.
  std::vector<SkipConnection> skips;
  // The options of the schedule's family, by `pptrain train`'s flag (`pptrain train --help`
  // lists them; docs/ASYNC.md), e.g. {{"--update-interval", 2}} for ampnet, {{"--avg-alpha",
  // 0.3}} for avgpipe, {{"--no-lr-reschedule", true}, {"--pipemare-warmup", 50}} for pipemare:
  // a switch is a bool, a count an int, a number a double. Those not given take their
  // defaults; one of another family's, or out of its range, is a UserError naming it.
  FamilyValues family;
  // Observers of every step's report (loss, times, peak memory, the measured timeline), on
  // rank 0; not owned. finish() ends them (writes the trace, the SVG).
  std::vector<StepObserver*> observers;
  // The run's length in steps (0: unknown; an asynchronous schedule needs it), the step it
  // starts at (a resumed run's: an asynchronous schedule then needs resume_from()), and the
  // tokens in one sample, for the reports (0: each step's inputs' second dimension, a
  // sequence length that changes from batch to batch).
  int steps = 0;
  int first_step = 0;
  double tokens_per_sample = 1;
  // What the observers are told of the run; unset: the library's own description.
  std::optional<RunInfo> run_info;
  // Called on every rank at the end of each step, after its updates and before its report is
  // gathered, with the steps done so far; returns the seconds it held the step, which the report
  // gives as checkpoint_stall_s. `pptrain train` saves its checkpoints there.
  std::function<double(int steps_done)> at_step_end;
};

// The one-process run of `options`' schedule on `stages` stages, all on one rank, one
// microbatch after the other, under the same weight rule: what an asynchronous schedule's
// pipeline must reproduce (as `pptrain train --pp 1 --stages S` does for pptrain's models).
// Give it as PipelineOptions::planned to a one-rank world holding every stage.
PlannedSchedule serial_reference(const PipelineOptions& options, int stages);

// One step's batch: the inputs (read by the first stage's rank) and the targets (by the last
// stage's rank); a tensor, or a bundle of them, each split into microbatches along dimension 0.
using Batch = std::pair<TensorBundle, TensorBundle>;
// The batch of step k (0-based). The schedule asks for each step's batch once, in order, and
// only on the ranks that hold the first or last stage.
using BatchSource = std::function<Batch(int step)>;

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
  // its elements, on the last stage's rank. UserError for an unknown schedule, options that do
  // not fit it, or stages that are not those the schedule puts on this rank. With
  // `data_parallel` or a replicated schedule it makes the groups of the ranks that combine
  // gradients: a collective over the world.
  PipelineSchedule(World world, std::vector<PipelineStage*> stages, PipelineOptions options,
                   LossFn loss);
  // The same with a loss on the last stage's output bundle and the targets' bundle.
  PipelineSchedule(World world, std::vector<PipelineStage*> stages, PipelineOptions options,
                   BundleLossFn loss);
  ~PipelineSchedule();
  PipelineSchedule(const PipelineSchedule&) = delete;
  PipelineSchedule& operator=(const PipelineSchedule&) = delete;

  // One training step on a mini-batch; see the top of this file. Returns the mean loss over the
  // microbatches (a float64 scalar, without autograd) on the rank that holds the last stage, an
  // undefined tensor elsewhere (a replicated last stage: each of its ranks returns its share,
  // and the shares sum to the mean). Synchronous schedules only.
  torch::Tensor step(const TensorBundle& inputs, const TensorBundle& targets);
  // The same, with the batches from a source: any schedule.
  torch::Tensor step(const BatchSource& batches);
  // Waits for the ranks, then tells the observers the run is over. Called by the destructor if
  // not before (unless an exception is on its way out, or abandon() was called).
  void finish();
  // The run ends without finish(): after a failure, when the other ranks may never reach it, so
  // that nothing waits for them. A wrapper that cannot tell how its owner ends (the Python
  // package) calls it before it lets go.
  void abandon();
  // Wall-clock seconds this rank spent in its F, I, W and B actions in the last step (a share of
  // a core, or a core shared with others, stretches them, unlike the CPU time the reports give).
  double last_compute_wall_s() const;

  // The lowered schedule every rank runs (with its SEND and RECV actions).
  const Schedule& schedule() const;
  // A checkpoint of the program's modules (train/checkpoint.h, ModuleCheckpoint); every rank
  // calls it after `steps_done` steps. `files` are this rank's files of it: the parameters of
  // the stages saved_stages() names, as the program writes them (`stage_<s>.pt`; a C++ stage's
  // `stage().archives({}, false)` are pptrain's layer files), and any of the program's own.
  // pptrain adds its optimizer's state and an asynchronous run's state in flight, writes it all
  // into DIR.partial and swaps it into `dir` once every rank's part is there; `keep` - 1 older
  // checkpoints stay beside it as DIR.step-<k>. std::runtime_error on every rank when one cannot
  // write; `dir` then still holds the previous checkpoint.
  void save(const std::string& dir, int steps_done, std::vector<ArchiveFile> files, int keep = 1);
  // The stages whose parameters this rank writes to a checkpoint: the first pipeline copy's,
  // each once (a replicated stage on its first replica's rank).
  std::vector<int> saved_stages() const;
  // Before the first step: continues the run checkpointed at `dir` by save(). UserError unless
  // it is whole and of this schedule's layout (schedule, stages, ranks, copies, zero, optimizer,
  // an asynchronous run's length). Loads pptrain's optimizer state and an asynchronous run's
  // state in flight, and numbers the next step after the checkpoint's. Returns the checkpoint
  // as read (its step, its files). The parameters are the program's to load (its stage files).
  ModuleCheckpoint resume(const std::string& dir);
  // What this rank writes to a checkpoint (train/checkpoint.h): the stages and optimizer state
  // no other rank writes, and for an asynchronous schedule what is in flight between two steps.
  // Needs `optimizer`.
  RankCheckpoint checkpoint() const;
  // Loads what a checkpoint folder holds beyond the parameters (--resume): this rank's
  // optimizer state, and for an asynchronous schedule its weight versions and what was in flight
  // after the checkpoint's step, which must be options.first_step. Before the first step; needs
  // `optimizer`.
  void resume_from(const std::string& dir);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pptrain
