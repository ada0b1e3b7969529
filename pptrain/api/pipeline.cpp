#include "pptrain/api/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/common/malloc.h"
#include "pptrain/device/memory.h"
#include "pptrain/device/placement.h"
#include "pptrain/device/precision.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/workers.h"
#include "pptrain/planner/schedule_request.h"
#include "pptrain/runtime/cluster_env.h"
#include "pptrain/runtime/group.h"
#include "pptrain/runtime/links.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/sim/memory_model.h"
#include "pptrain/train/stage_copies.h"
#include "pptrain/train/tied_parameters.h"
#include "pptrain/train/updates.h"

namespace pptrain {
namespace {

using Clock = std::chrono::steady_clock;

// A test hook: PPTRAIN_TEST_OVERFLOW_STEP=k PPTRAIN_TEST_OVERFLOW_RANK=r makes world rank r start
// the backwards of step k (1-based) from 2^100 times the loss scale: the fp16 gradients of that
// rank's last stage overflow, as a real overflow does there, and the infinities go where a real
// one's go (the earlier stages, the copies' averages). The factor to multiply the scale by.
double overflow_factor_for_test(int step, int rank) {
  const char* at_step = std::getenv("PPTRAIN_TEST_OVERFLOW_STEP");
  const char* at_rank = std::getenv("PPTRAIN_TEST_OVERFLOW_RANK");
  const bool now =
      at_step && at_rank && std::atoi(at_step) == step + 1 && std::atoi(at_rank) == rank;
  return now ? std::ldexp(1.0, 100) : 1.0;
}

std::vector<torch::nn::AnyModule> modules_of(const torch::nn::Sequential& part) {
  std::vector<torch::nn::AnyModule> out;
  for (const auto& module : *part) out.push_back(module);
  return out;
}

// 0, the split points, then `size`: part p is [bounds[p], bounds[p + 1]). UserError unless the
// points ascend within 1 .. size - 1.
std::vector<int> cut_bounds(int size, const std::vector<int>& split_points) {
  std::vector<int> bounds = {0};
  for (int point : split_points) {
    PPTRAIN_CHECK(point > bounds.back() && point < size, "split point ", point,
                  " is not in ascending order within 1..", size - 1);
    bounds.push_back(point);
  }
  bounds.push_back(size);
  return bounds;
}

// The run `options` ask for on P = `ranks` ranks, as the one resolver takes it
// (planner/run_request.h), its errors naming PipelineOptions' fields.
RunRequest run_request(const PipelineOptions& options, int ranks) {
  RunRequest run;
  run.optimizer = options.optimizer;
  run.zero = options.zero;
  run.dp_shares = options.data_parallel_shares;
  run.recompute = options.recompute;
  run.ties = options.tied;
  run.skips = options.skips;
  ScheduleRequest& request = run.schedule;
  OptionNames& names = request.names;
  names.schedule = "schedule";
  names.pp = "the pipeline's ranks";
  names.microbatches = "microbatches";
  names.chunks = "chunks";
  names.steps = "steps";
  names.dp = "data_parallel";
  names.dp_shares = "data_parallel_shares";
  names.skips = "skips";
  names.zero = "zero";
  names.optimizer = "optimizer.kind";
  names.lr = "optimizer.lr";
  names.momentum = "optimizer.momentum";
  names.warmup_steps = "optimizer.warmup_steps";
  names.clip = "optimizer.clip";
  names.post_validation = "optimizer.post_validation";
  names.exact_rollback = "optimizer.exact_rollback";
  request.schedule = options.schedule;
  request.file = options.schedule_file;
  request.file_name = options.schedule_file;
  request.pp = ranks;
  request.microbatches = options.microbatches;
  request.chunks = options.chunks;
  request.steps = options.steps;
  request.family = options.family;
  request.dp = options.data_parallel;
  request.skips = skip_links(options.skips);
  return run;
}

PlannedSchedule planned_of(const RequestedSchedule& made) {
  return {made.validated, made.rule, made.averages_copies};
}

std::string list_text(const std::vector<int>& v) {
  std::string text;
  for (int x : v) text += (text.empty() ? "" : ", ") + std::to_string(x);
  return text.empty() ? std::string("none") : text;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

PlannedSchedule serial_reference(const PipelineOptions& options, int stages) {
  PPTRAIN_CHECK(options.schedule_file.empty() && !options.planned,
                "serial_reference() takes a schedule of the registry");
  RunRequest request = run_request(options, 1);
  request.schedule.one_process = true;
  request.schedule.stages = stages;
  return planned_of(resolve_run(request, CostModel()).schedule);
}

// The run of one pipeline: P = the world's ranks over the data-parallel copies. A schedule
// planned already (`pptrain train`'s) is checked as the one the options would make.
static ResolvedRun resolve_pipeline(const World& world, const PipelineOptions& options) {
  const int copies = std::max(options.data_parallel, 1);
  PPTRAIN_CHECK(world.size % copies == 0, "data_parallel ", copies, " does not divide the ",
                world.size, " ranks");
  const RunRequest request = run_request(options, world.size / copies);
  if (!options.planned) return resolve_run(request, CostModel());
  const PlannedSchedule& planned = *options.planned;
  return resolve_run(
      RequestedSchedule{planned.schedule, planned.weights, planned.averages, std::nullopt},
      request);
}

StagePlacement place_stages(const World& world, const PipelineOptions& options) {
  const ValidatedSchedule schedule = resolve_pipeline(world, options).schedule.validated;
  return {schedule->num_stages, schedule->stages_of(world.rank % schedule->num_ranks)};
}

World init_from_env() {
  World world;
  const ClusterEnv env = cluster_env_of_process();
  if (!is_launched_rank(env)) {
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
  const std::vector<int> bounds = cut_bounds(size, split_points);
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
    : PipelineStage(Stage(stage_index, 0, modules_of(module)), num_stages,
                    std::function<Stage()>()) {}

PipelineStage::PipelineStage(torch::nn::AnyModule module, int stage_index, int num_stages,
                             bool takes_bundle)
    : PipelineStage(Stage(stage_index, 0, {std::move(module)}, {takes_bundle}), num_stages,
                    std::function<Stage()>()) {}

PipelineStage::PipelineStage(Stage stage, int num_stages, std::function<Stage()> make_copy)
    : stage_(std::move(stage)), num_stages_(num_stages), make_copy_(std::move(make_copy)) {
  PPTRAIN_CHECK(stage_.index() >= 0 && stage_.index() < num_stages, "stage index ", stage_.index(),
                " is not in 0..", num_stages - 1);
}

namespace {

// Stage `index` of a model given as layer factories: its layers built, the rest not.
Stage stage_from_factories(const std::vector<LayerFactory>& layers,
                           const std::vector<int>& split_points, int index) {
  const std::vector<int> bounds = cut_bounds(static_cast<int>(layers.size()), split_points);
  PPTRAIN_CHECK(index >= 0 && index + 1 < static_cast<int>(bounds.size()), "stage index ", index,
                " is not in 0..", bounds.size() - 2);
  std::vector<torch::nn::AnyModule> modules;
  for (int i = bounds[index]; i < bounds[index + 1]; ++i) {
    PPTRAIN_CHECK(layers[i] != nullptr, "layer factory ", i, " is empty");
    modules.push_back(layers[i]());
  }
  return Stage(index, bounds[index], std::move(modules));
}

}  // namespace

PipelineStage::PipelineStage(const std::vector<LayerFactory>& layers,
                             const std::vector<int>& split_points, int stage_index)
    : PipelineStage(stage_from_factories(layers, split_points, stage_index),
                    static_cast<int>(split_points.size()) + 1, [layers, split_points, stage_index] {
                      return stage_from_factories(layers, split_points, stage_index);
                    }) {}

void PipelineStage::tie(const std::string& name, torch::Tensor parameter) {
  bool found = false;
  for (const auto& p : stage_.parameters()) found = found || p.is_same(parameter);
  PPTRAIN_CHECK(found, "stage ", index(), " ties '", name,
                "' to a tensor that is not one of its parameters");
  ties_.emplace_back(name, std::move(parameter));
}

void PipelineStage::take_from_batch(std::vector<std::string> names) {
  PPTRAIN_CHECK(index() > 0,
                "stage 0 takes the whole batch already; take_from_batch() is for "
                "later stages");
  PPTRAIN_CHECK(!names.empty(), "stage ", index(), ": take_from_batch() of no names");
  batch_inputs_ = std::move(names);
}

Stage PipelineStage::copy() const {
  if (make_copy_) return make_copy_();
  std::vector<torch::nn::AnyModule> clones;
  for (const auto& layer : stage_.layers()) {
    try {
      clones.push_back(layer.clone());
    } catch (const std::exception&) {
      throw UserError("stage " + std::to_string(index()) + ": module " + layer.ptr()->name() +
                      " cannot be cloned, and an asynchronous schedule keeps copies of a "
                      "stage's weights; derive it from torch::nn::Cloneable");
    }
  }
  return Stage(stage_.index(), stage_.first_layer(), std::move(clones), stage_.bundle_layers());
}

struct PipelineSchedule::Impl {
  Impl(World w, std::vector<PipelineStage*> s, PipelineOptions o, BundleLossFn l);

  World world;
  std::vector<PipelineStage*> stages;
  PipelineOptions options;
  BundleLossFn loss;
  int copies = 1;           // D
  ResolvedRun resolved;     // the run the options describe, checked (planner/run_request.h)
  PlannedSchedule planned;  // its schedule and weight rule
  RunInfo run;
  torch::Device device = torch::kCPU;  // where the stages compute: place_on_device()
  std::string links_line;  // gather_links(): "links: shm between ranks 0-1"; empty for one rank
  std::vector<std::pair<std::string, std::string>> links;  // RunInfo::links
  int pipeline_rank = 0;                                   // this rank in its copy of the pipeline
  int copy = 0;                                            // which copy of the pipeline
  Group pipeline;                                          // the ranks of this copy of the pipeline
  Group stage_copies;  // the D ranks holding this rank's pipeline position
  std::map<std::vector<int>, Group> replica_groups;
  std::vector<Group> tie_groups;  // per options.tied entry this rank holds a copy of
  TiedParameters tied;
  std::optional<RankWeights> weights;  // with options.optimizer
  std::optional<StageCopies> combine;  // the stages whose gradients are combined with others'
  CopyAveraging averaging;             // avgpipe's (planned.averages), from options.family
  std::optional<AsyncUpdates> async;
  std::map<int, int> owner;             // zero 1: model layer -> the copy keeping its state
  std::vector<torch::Tensor> counted;   // parameters whose gradient norm this rank adds
  RankCheckpoint saved;                 // what this rank writes to a checkpoint
  std::optional<LossScale> loss_scale;  // fp16's (PipelineOptions::precision)
  std::optional<Executor> executor;     // made at the first step
  std::optional<NamedTensors> resumed;  // an asynchronous run's state in flight, for the executor
  int next_step = 0;
  double last_compute_wall_s = 0;  // StepCosts::compute_s of the last step
  int ahead = 0;                   // later steps whose microbatches a step's segment may use
  std::map<int, Batch> fetched;    // batches asked of the source, by step, not yet all used
  int64_t batch_rows = 0;          // of the latest step's batch on this rank (0: none read)
  int64_t batch_tokens = 1;        // its second dimension (a sequence length), for the reports
  bool finished = false;
  int64_t weight_bytes = 0;  // of a synchronous rank's stages (and avgpipe's centre)
  // Its stages' parameter (and gradient) bytes made before the counting allocator was installed
  // (a module built before its pipeline): added to the peak the allocator measures.
  int64_t uncounted_parameter_bytes = 0;
  Clock::time_point step_start;  // of the step, or of the asynchronous segment
  // An asynchronous pipeline's step reports are sent without waiting, and waited on a step later.
  std::vector<PendingComm> unsent_reports, older_reports;

  const Schedule& schedule() const { return *planned.schedule; }
  bool asynchronous() const { return planned.weights.asynchronous(); }
  int ranks() const { return schedule().num_ranks; }
  ModuleCheckpoint layout(int steps_done) const;

  void check_stages() const;
  // PipelineOptions::device: the stages moved there; unset, the device their modules are on.
  void place_on_device();
  void make_groups();
  // The links the pipeline's messages take between each pair of ranks that exchange them, as
  // every rank's transport reports them (a sum over the world), for the start line and the
  // metrics. A collective.
  void gather_links();
  void make_ties();
  void make_weights();
  StepData step_data(int step, const BatchSource& batches);
  void start(int64_t batch_size);
  double update(int step, const StepRecord& record, RankStep& mine);
  void predict_memory(const StepRecord& record, const StepData& data, bool first_step,
                      bool fresh_state, RankStep& mine);
  std::optional<RankMemory> async_prediction;  // an asynchronous run's, from its first step
  std::optional<MemoryWalk> memory_walk;       // the schedule's part of the model, made once
  std::string nonfinite_message(int step, double grad_norm, const StepRecord& record) const;

  PipelineStage* local(int index) const {
    for (PipelineStage* stage : stages) {
      if (stage->index() == index) return stage;
    }
    return nullptr;
  }
  bool holds(int stage) const {
    const auto holders = schedule().replicas_of(stage);
    return std::count(holders.begin(), holders.end(), pipeline_rank) > 0;
  }
  // World ranks of copy d's pipeline: d x P .. d x P + P - 1.
  std::vector<int> pipeline_of(int d) const {
    std::vector<int> out;
    for (int p = 0; p < ranks(); ++p) out.push_back(d * ranks() + p);
    return out;
  }
  // World ranks of the D copies of pipeline rank `p` (p, P + p, ...).
  std::vector<int> copies_of(int p) const {
    std::vector<int> out;
    for (int d = 0; d < copies; ++d) out.push_back(d * ranks() + p);
    return out;
  }
};

PipelineSchedule::Impl::Impl(World w, std::vector<PipelineStage*> s, PipelineOptions o,
                             BundleLossFn l)
    : world(std::move(w)),
      stages(std::move(s)),
      options(std::move(o)),
      loss(std::move(l)),
      copies(std::max(options.data_parallel, 1)),
      resolved(resolve_pipeline(world, options)),
      planned(planned_of(resolved.schedule)),
      run(planned.schedule) {
  // From here on every tensor of the run is counted (its gradients, optimizer state, versions);
  // the stages' parameters, and gradients a program made before, are added.
  install_counting_allocator();
  keep_freed_memory();  // the steps' tensors reuse the memory of the last ones (memory.h)
  std::vector<torch::Tensor> made_before;
  for (PipelineStage* stage : stages) {
    for (const torch::Tensor& p : stage->stage().parameters()) {
      made_before.push_back(p);
      made_before.push_back(p.grad());
    }
  }
  uncounted_parameter_bytes = uncounted_bytes(made_before);
  PPTRAIN_CHECK(world.size == copies * ranks(), schedule().name, " runs on ", ranks(),
                " ranks per pipeline x ", copies, " copies, but the world has ", world.size);
  pipeline_rank = world.rank % ranks();
  copy = world.rank / ranks();
  next_step = options.first_step;
  const bool averages = planned.averages;
  PPTRAIN_CHECK(!asynchronous() || options.optimizer, schedule().name,
                " is asynchronous: it steps each stage between microbatches, so set "
                "PipelineOptions::optimizer for pptrain to run the optimizer");
  PPTRAIN_CHECK(!averages || options.optimizer, schedule().name,
                " averages the weights of the copies every few steps, so set "
                "PipelineOptions::optimizer for pptrain to run the optimizer");
  PPTRAIN_CHECK(options.zero == 0 || options.optimizer,
                "zero 1 shards the optimizer state pptrain keeps, so set "
                "PipelineOptions::optimizer for pptrain to run the optimizer");
  PPTRAIN_CHECK(!options.casts_per_step || options.precision != Precision::kFp32,
                "weights cast once per step need precision bf16 or fp16: fp32 casts nothing");
  if (scales_loss(options.precision)) {
    PPTRAIN_CHECK(options.optimizer,
                  "precision fp16 skips the steps whose gradients overflow, so set "
                  "PipelineOptions::optimizer for pptrain to run (and skip) the optimizer");
    PPTRAIN_CHECK(!asynchronous() && !averages,
                  "precision fp16 takes one decision per step on "
                  "every rank to skip an overflowed step, but ",
                  schedule().name, " steps its stages at different times: use bf16");
    loss_scale.emplace(options.loss_scale);
  }
  check_stages();
  place_on_device();
  if (averages) averaging = copy_averaging(options.family, copies);
  make_groups();
  gather_links();
  make_ties();
  make_weights();
  // avgpipe's copies combine no gradients: they pull their weights to a centre kept beside them.
  if (averages) combine->keep_centre();
  for (PipelineStage* stage : stages) {
    weight_bytes += (averages ? 2 : 1) * parameter_bytes(stage->stage());
  }
  if (asynchronous()) {
    const int S = schedule().num_stages, M = planned.weights.microbatches_per_step;
    ahead = (S - 1 + M - 1) / M;  // the first stage runs S-1 forwards ahead, into later steps
  }
}

void PipelineSchedule::Impl::check_stages() const {
  const Schedule& s = schedule();
  std::vector<int> given;
  for (PipelineStage* stage : stages) {
    PPTRAIN_CHECK(stage != nullptr, "a null stage was given");
    PPTRAIN_CHECK(stage->num_stages() == s.num_stages, "stage ", stage->index(), " is one of ",
                  stage->num_stages(), " stages, but ", s.name, " on ", s.num_ranks, " ranks has ",
                  s.num_stages);
    given.push_back(stage->index());
  }
  std::sort(given.begin(), given.end());
  const std::vector<int> expected = s.stages_of(pipeline_rank);
  PPTRAIN_CHECK(given == expected, s.name, " puts stages ", list_text(expected), " on rank ",
                world.rank, ", but it was given stages ", list_text(given));
  PPTRAIN_CHECK(loss || !holds(s.num_stages - 1),
                "the rank of the last stage needs a loss function");
}

void PipelineSchedule::Impl::place_on_device() {
  std::optional<torch::Device> found = options.device;
  for (PipelineStage* stage : stages) {
    for (const auto& module : stage->stage().modules()) {
      if (options.device) {
        module->to(*options.device);
      } else if (!module->parameters().empty() || !module->buffers().empty()) {
        const torch::Device here = device_of(*module);
        PPTRAIN_CHECK(!found || *found == here, "stage ", stage->index(), " is on ", here.str(),
                      " but another of this rank's stages is on ", found->str(),
                      ": give PipelineOptions::device, or move them to one device");
        found = here;
      }
    }
  }
  device = found.value_or(torch::Device(torch::kCPU));
}

void PipelineSchedule::Impl::gather_links() {
  if (world.size == 1) return;
  LinkTable mine(world.size);
  const std::vector<int> members = pipeline_of(copy);
  for (int q = 0; q < ranks(); ++q) {
    const LinkKind kind = pipeline->link_to(q);
    // A rank on a GPU packs its messages into host memory and unpacks them there (Executor).
    mine.set(world.rank, members[q], device.is_cuda() ? staged(kind) : kind);
  }
  const std::vector<int64_t> codes = mine.codes();
  torch::Tensor sum = torch::tensor(codes, torch::kInt64);
  world.transport->allreduce_sum(sum);
  const LinkTable table = LinkTable::from_codes(
      world.size,
      std::vector<int64_t>(sum.data_ptr<int64_t>(), sum.data_ptr<int64_t>() + sum.numel()));
  std::set<std::pair<int, int>> pipeline_pairs;
  const Schedule& s = schedule();
  for (int p = 0; p < s.num_ranks; ++p) {
    for (const Action& a : s.actions[p]) {
      if (!is_send(a.op)) continue;
      const int q = rank_of_peer(s, a);
      if (q != p) pipeline_pairs.insert({std::min(p, q), std::max(p, q)});
    }
  }
  std::vector<std::pair<int, int>> pairs;
  for (int d = 0; d < copies; ++d) {
    const std::vector<int> ranks_of_copy = pipeline_of(d);
    for (const auto& [p, q] : pipeline_pairs) pairs.push_back({ranks_of_copy[p], ranks_of_copy[q]});
  }
  links_line = table.describe(pairs);
  for (const auto& [a, b] : pairs) {
    links.push_back({std::to_string(a) + "-" + std::to_string(b), table.pair_name(a, b)});
  }
}

// Every rank makes the pipelines' groups, then the copies' groups: the groups each family makes
// are disjoint, so no rank waits for one that is forming another group. Then, in a replicated
// schedule, each group of a stage's replicas, once, every rank going through the stages in
// order. Which stages combine gradients with which ranks: with copies, all of this rank's with
// their copies (a mean); in a replicated schedule each replicated stage with its replicas (a
// sum).
void PipelineSchedule::Impl::make_groups() {
  Transport& transport = *world.transport;
  pipeline = make_group(transport, pipeline_of(copy));
  stage_copies = make_group(transport, copies_of(pipeline_rank));
  const Schedule& s = schedule();
  for (int stage = 0; stage < s.num_stages && copies == 1; ++stage) {
    const std::vector<int> members = s.replicas_of(stage);
    if (members.size() > 1 && local(stage) && !replica_groups.count(members)) {
      replica_groups.emplace(members, make_group(*pipeline, members));
    }
  }
  std::vector<StageGroup> combined;
  for (PipelineStage* stage : stages) {
    const std::vector<int> members = s.replicas_of(stage->index());
    const std::vector<int>& shares = options.data_parallel_shares;
    if (copies > 1 && !equal_shares(shares)) {
      combined.push_back({&stage->stage(), stage_copies.view, 1, share_weight(shares, copy)});
    } else if (copies > 1) {
      combined.push_back({&stage->stage(), stage_copies.view, copies});
    } else if (members.size() > 1) {
      combined.push_back({&stage->stage(), replica_groups.at(members).view, 1});
    }
  }
  combine.emplace(combined);
}

// Each tied parameter's copies on this rank, and the group of the ranks holding the others;
// then the copies agree (a collective over those ranks, in the order of options.tied).
void PipelineSchedule::Impl::make_ties() {
  const Schedule& s = schedule();
  std::vector<TiedCopies> ties;
  std::vector<std::string> names;
  for (const TiedParameter& tie : resolved.ties) {  // checked, stages of 0..S-1 ascending
    names.push_back(tie.name);
    const std::vector<int>& stages = tie.stages;
    TiedCopies copies{tie.name, stages, {}, nullptr, {}};
    std::vector<int> members;
    for (int stage : stages) members.push_back(s.stage_to_rank[stage]);
    std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());
    for (int stage : stages) {
      PipelineStage* held = local(stage);
      if (!held) continue;
      bool declared = false;
      for (const auto& [name, tensor] : held->ties()) {
        if (name != tie.name) continue;
        copies.local.emplace_back(stage, tensor);
        declared = true;
      }
      PPTRAIN_CHECK(declared, "tied parameter '", tie.name, "' is on stage ", stage,
                    ", which tied no tensor to it (PipelineStage::tie)");
    }
    if (copies.local.empty()) continue;  // this rank holds no copy
    if (members.size() > 1) {
      tie_groups.push_back(make_group(*pipeline, members));
      copies.group = tie_groups.back().view;
      for (int stage : stages) {
        const auto at = std::find(members.begin(), members.end(), s.stage_to_rank[stage]);
        copies.ranks.push_back(static_cast<int>(at - members.begin()));
      }
    }
    ties.push_back(std::move(copies));
  }
  for (PipelineStage* stage : stages) {
    for (const auto& [name, tensor] : stage->ties()) {
      PPTRAIN_CHECK(std::count(names.begin(), names.end(), name) > 0, "stage ", stage->index(),
                    " ties a tensor to '", name, "', which PipelineOptions::tied does not list");
    }
  }
  tied = TiedParameters(std::move(ties));
  tied.agree();
}

// The gradients (allocated now, so a step's memory peak counts only what the step allocates),
// and with options.optimizer the optimizers and weight versions; what this rank counts in the
// gradient norm and writes to a checkpoint.
void PipelineSchedule::Impl::make_weights() {
  const Schedule& s = schedule();
  std::vector<Stage*> runtime_stages;
  std::vector<std::function<Stage()>> make_copy;
  for (PipelineStage* stage : stages) {
    runtime_stages.push_back(&stage->stage());
    make_copy.push_back([stage] { return stage->copy(); });
    for (auto& p : stage->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
  }
  if (options.zero == 1) {
    std::vector<int> layers;
    std::vector<int64_t> numel;
    for (Stage* stage : runtime_stages) {
      for (int i = 0; i < stage->num_layers(); ++i) {
        PPTRAIN_CHECK(
            std::find(layers.begin(), layers.end(), stage->first_layer() + i) == layers.end(),
            "zero 1 needs stages whose layer numbers do not overlap; layer ",
            stage->first_layer() + i, " is in two");
        layers.push_back(stage->first_layer() + i);
        numel.push_back(0);
        for (const auto& p : stage->layer_parameters(i)) numel.back() += p.numel();
      }
    }
    const std::vector<int> owners = zero_owners(numel, copies);
    for (size_t i = 0; i < layers.size(); ++i) owner[layers[i]] = owners[i];
  }
  if (options.optimizer) {
    const auto keeps = [this](int layer) { return owner.empty() || owner.at(layer) == copy; };
    // The one-process run of an asynchronous rule (one rank, stages in turn) runs later forwards
    // than the pipeline before the same backwards, so it may need versions the pipeline never
    // holds at once: it always keeps them as snapshots.
    const bool serial = ranks() == 1 && asynchronous();
    weights.emplace(runtime_stages, make_copy, planned.weights, *options.optimizer, options.family,
                    keeps, serial);
    if (asynchronous()) async.emplace(planned.weights, *options.optimizer, *weights, &tied);
  }
  for (size_t l = 0; l < stages.size(); ++l) {
    const Stage& stage = stages[l]->stage();
    const bool first_replica = s.replicas_of(stage.index()).front() == pipeline_rank;
    if (first_replica) {
      for (const auto& p : stage.parameters()) {
        if (!tied.is_extra_copy(p)) counted.push_back(p);  // a tied parameter counts once
      }
    }
    // The first copy of the pipeline writes the checkpoints (the others hold the same weights,
    // and unless zero 1 gave each copy its own layers' state, the same optimizer state).
    if (first_replica && copy == 0) {
      saved.stages.push_back(&stage);
      for (const auto& p : stage.parameters()) {
        if (!tied.is_extra_copy(p)) continue;  // a tied parameter is stored once
        const auto [layer, name] = stage.find_parameter(p);
        if (layer >= 0) saved.left_out[layer].push_back(name);
      }
    }
    if (weights && first_replica && (copy == 0 || options.zero == 1)) {
      saved.optimizers.push_back(&weights->optimizers[l]);
      for (const auto& p : stage.parameters()) {
        if (tied.is_extra_copy(p)) weights->optimizers[l].store_elsewhere(p);  // as its values
      }
    }
  }
}

// Step `step`'s microbatches that this rank reads: inputs on the first stage's rank, targets on
// the last's, nothing elsewhere. An asynchronous pipeline, which runs forwards of later steps
// already, also gets theirs, numbered from step x M as the run-long schedule numbers them.
StepData PipelineSchedule::Impl::step_data(int step, const BatchSource& batches) {
  StepData data;
  const int M = planned.weights.microbatches_per_step;
  data.first_microbatch = asynchronous() ? step * M : 0;
  bool first = holds(0);  // reads the inputs: stage 0's rank, or one taking from the batch
  for (PipelineStage* stage : stages) first = first || !stage->batch_inputs().empty();
  const bool last = holds(schedule().num_stages - 1);
  if (!first && !last) return data;
  const int end = asynchronous() ? std::min(options.steps, step + 1 + ahead) : step + 1;
  for (int k = step; k < end; ++k) {
    auto it = fetched.find(k);
    if (it == fetched.end()) it = fetched.emplace(k, batches(k)).first;
    const auto& [inputs, targets] = it->second;
    PPTRAIN_CHECK(!first || !inputs.empty(), "rank ", world.rank,
                  " reads the batch's inputs (for stage 0 or a stage's take_from_batch) but step() "
                  "was given none");
    PPTRAIN_CHECK(!last || !targets.empty(), "rank ", world.rank,
                  " holds the last stage but step() was given no targets");
    if (first) {
      for (auto& x : split_bundle(inputs, M, "input")) data.inputs.push_back(on_device(x, device));
    }
    if (last) {
      for (auto& y : split_bundle(targets, M, "target")) {
        data.targets.push_back(on_device(y, device));
      }
    }
  }
  const Batch& batch = fetched.at(step);
  const TensorBundle& some = !batch.first.empty() ? batch.first : batch.second;
  batch_rows = !some.empty() && some[0].defined() && some[0].dim() > 0 ? some[0].size(0) : 0;
  const std::vector<int>& shares = options.data_parallel_shares;
  PPTRAIN_CHECK(shares.empty() || batch_rows == shares[copy], "rank ", world.rank, " (copy ", copy,
                ") was given a batch of ", batch_rows,
                " rows, but data_parallel_shares gives its copy ",
                shares.empty() ? 0 : shares[copy]);
  batch_tokens = !some.empty() && some[0].defined() && some[0].dim() > 1 ? some[0].size(1) : 1;
  fetched.erase(fetched.begin(), fetched.lower_bound(step + 1));
  return data;
}

void PipelineSchedule::Impl::start(int64_t batch_size) {
  ExecutorOptions executor_options;
  executor_options.rank = pipeline_rank;
  for (PipelineStage* stage : stages) executor_options.stages.push_back(&stage->stage());
  executor_options.transport = pipeline.view;
  executor_options.loss = loss;
  for (PipelineStage* stage : stages) {
    if (!stage->batch_inputs().empty()) {
      executor_options.batch_inputs[stage->index()] = stage->batch_inputs();
    }
    if (!stage->kept_dtype().empty()) {
      executor_options.kept_dtype[stage->index()] = stage->kept_dtype();
    }
  }
  executor_options.skips = options.skips;
  executor_options.compute_dtype = compute_dtype(options.precision);
  executor_options.casts_per_step = options.casts_per_step;
  executor_options.device = device;
  // A backward on other weights than its forward's rebuilds the graph on them.
  executor_options.recompute = options.recompute || planned.weights.backward_reruns_forward();
  // An asynchronous schedule runs whole backwards (B), on weight versions: there is no split.
  executor_options.weight_split =
      async ? ExecutorOptions::WeightSplit::kDeferredLayers : options.weight_split;
  executor_options.microbatches_per_step = planned.weights.microbatches_per_step;
  executor_options.reduce_gradients = [this](int stage) { combine->start_average(stage); };
  if (async) {
    executor_options.weights = [this](int stage, int mb, bool backward) -> Stage& {
      return async->weights(stage, mb, backward);
    };
    executor_options.after_backward = [this](int stage, int mb) {
      async->after_backward(stage, mb);
    };
  }
  executor.emplace(planned.schedule, std::move(executor_options));
  if (asynchronous() && next_step > 0) {
    PPTRAIN_CHECK(resumed, schedule().name, " is asynchronous and starts at step ", next_step + 1,
                  ": it needs what was in flight after step ", next_step,
                  " (PipelineSchedule::resume_from)");
    executor->resume(next_step, *resumed, "--resume");
    resumed.reset();
  }
  if (options.run_info) {
    run = *options.run_info;
  } else {
    run.copies = copies;
    run.microbatches = planned.weights.microbatches_per_step;
    run.steps = options.steps;
    run.first_step = options.first_step;
    run.tokens_per_sample = options.tokens_per_sample;
    run.batch_size = batch_size * copies;
    if (!equal_shares(options.data_parallel_shares)) {
      run.dp_shares = options.data_parallel_shares;
      run.batch_size = 0;
      for (int share : run.dp_shares) run.batch_size += share;
    }
    run.asynchronous = asynchronous();
    run.header = "pipeline of " + std::to_string(schedule().num_stages) + " stages with " +
                 schedule().name + ": " + std::to_string(world.size) + " rank" +
                 (world.size == 1 ? "" : "s") + ", " + std::to_string(run.microbatches) +
                 " microbatches";
  }
  if (!links_line.empty()) run.header += "\n" + links_line;
  run.links = links;
  run.restart = cluster_env_of_process().restart_count;
  if (world.rank == 0) {
    for (StepObserver* o : options.observers) o->on_start(run);
  }
}

// Why a run stops at a step whose gradients are not finite: the step, the norm, and the loss on
// the rank that computed it.
std::string PipelineSchedule::Impl::nonfinite_message(int step, double grad_norm,
                                                      const StepRecord& record) const {
  std::string text =
      "step " + std::to_string(step + 1) + ": the gradient norm is " + std::to_string(grad_norm);
  const int last = schedule().stage_to_rank.back();
  if (record.has_loss) {
    text += " and the loss is " + std::to_string(record.loss) + " on rank " + std::to_string(last);
  } else {
    text += " (the loss is on rank " + std::to_string(last) + ")";
  }
  return text + "; stopped before the optimizer step (a smaller --lr may help; " +
         "--skip-nonfinite skips such steps instead)";
}

// After a synchronous step's flush: the combined gradients, and with an optimizer the clipped
// step (or post-validated one), ZeRO's weights and avgpipe's pull. Returns the gradient norm
// (0 without an optimizer).
double PipelineSchedule::Impl::update(int step, const StepRecord& record, RankStep& mine) {
  // avgpipe's copies keep their own gradients.
  const bool averaged = planned.averages;
  if (!averaged) {
    // A reduction's event ends when its sum is known to be back (it only started it).
    const auto reduced = combine->finish_average();
    for (TimelineEvent& e : mine.events) {
      if (e.action.op == Op::REDUCE_GRAD && reduced.count(e.action.stage)) {
        e.end = std::chrono::duration<double>(reduced.at(e.action.stage) - step_start).count();
      }
    }
  }
  tied.sum_gradients();
  if (!weights) return 0;
  const OptimizerOptions& optimizer = *options.optimizer;
  if (loss_scale) {  // fp16: the gradients of the scaled loss, back to the loss's own
    unscale_gradients(weights->params, loss_scale->scale());
    mine.loss_scale = loss_scale->scale();
  }
  // The copies now hold the same gradients: the norm is the one pipeline's (avgpipe: each
  // copy's own). Every rank of a pipeline has the same norm (and with averaged gradients every
  // copy), so they take the same branch.
  const double norm =
      optimizer.post_validation
          ? post_validated_step(optimizer, step, *weights, counted, *pipeline, mine.rollbacks)
          : clip_grad_norm(weights->params, optimizer.clip, pipeline.view, &counted);
  // (post_validated_step() has stepped already, or taken the step back when the norm is not
  // finite.) fp16: an overflow anywhere made the global norm infinite on every rank, so every
  // rank skips this step and halves its scale here.
  if (loss_scale && !loss_scale->update(std::isfinite(norm))) {
    mine.skipped = true;
    return norm;
  }
  if (!std::isfinite(norm)) {
    if (!optimizer.skip_nonfinite) throw std::runtime_error(nonfinite_message(step, norm, record));
  } else if (!optimizer.post_validation) {
    for (auto& stage_optimizer : weights->optimizers) {
      stage_optimizer.set_lr(optimizer.lr_at(step));
      stage_optimizer.step();
    }
    // zero 1: each copy stepped its own layers; the others get their new weights.
    if (options.zero == 1) combine->share_weights(owner, copy);
  }
  // avgpipe: every copy, whichever branch its own norm took, joins the pull.
  if (averaged && (step + 1) % averaging.every == 0) combine->pull_to_centre(averaging.alpha);
  return norm;
}

PipelineSchedule::PipelineSchedule(World world, std::vector<PipelineStage*> stages,
                                   PipelineOptions options, BundleLossFn loss)
    : impl_(std::make_unique<Impl>(std::move(world), std::move(stages), std::move(options),
                                   std::move(loss))) {}

PipelineSchedule::PipelineSchedule(World world, std::vector<PipelineStage*> stages,
                                   PipelineOptions options, LossFn loss)
    : PipelineSchedule(std::move(world), std::move(stages), std::move(options),
                       loss ? bundle_loss(std::move(loss)) : BundleLossFn()) {}

PipelineSchedule::~PipelineSchedule() {
  if (std::uncaught_exceptions() > 0) return;  // the ranks may not all get here
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() explicitly to see the error
  }
}

const Schedule& PipelineSchedule::schedule() const {
  return impl_->schedule();
}

RankCheckpoint PipelineSchedule::checkpoint() const {
  PPTRAIN_CHECK(impl_->weights,
                "a checkpoint holds optimizer state: set PipelineOptions::optimizer");
  RankCheckpoint out = impl_->saved;
  if (impl_->loss_scale && impl_->world.rank == 0) {
    const LossScale* scale = &*impl_->loss_scale;
    out.loss_scale = [scale] {
      NamedTensors state;
      scale->save_state(state);
      return state;
    };
  }
  if (impl_->asynchronous()) {
    const Impl* impl = impl_.get();
    out.pipeline_rank = impl->pipeline_rank;
    out.in_flight = [impl] {
      PPTRAIN_CHECK(impl->executor,
                    "a checkpoint of an asynchronous schedule after its first step");
      PPTRAIN_CHECK(impl->tied.empty() || impl->next_step == impl->options.steps,
                    "tied parameters under ", impl->schedule().name,
                    " are checkpointed after the run's last step only (the updates their copies "
                    "still owe each other are not saved yet)");
      NamedTensors state = impl->executor->in_flight();
      impl->async->save_state(state);
      return state;
    };
  }
  return out;
}

// The memory model's parts for this rank (sim/memory_model.h): its stages' parameters, the state
// its optimizers keep, and what a microbatch held on each in this step. An asynchronous
// schedule is one list over the run, simulated once, from its first step's bytes.
void PipelineSchedule::Impl::predict_memory(const StepRecord& record, const StepData& data,
                                            bool first_step, bool fresh_state, RankStep& mine) {
  if (!counting_allocator_installed()) return;
  if (!asynchronous() || !async_prediction) {
    std::vector<StageBytes> bytes =
        measured_stage_bytes(record.action_bytes, schedule().num_stages, options.casts_per_step);
    const double state_per_byte =
        options.optimizer ? state_bytes_per_parameter_byte(*options.optimizer) : 0;
    // The batch is read by the first stage (inputs) and the last (targets); a rank holding both
    // (or batch inputs of a later stage) counts it once.
    double batch = 0;
    for (const auto* part : {&data.inputs, &data.targets}) {
      for (const TensorBundle& bundle : *part) batch += static_cast<double>(bundle_bytes(bundle));
    }
    bytes[stages.front()->index()].data = batch;
    for (PipelineStage* stage : stages) {
      StageBytes& b = bytes[stage->index()];
      for (const torch::Tensor& p : stage->stage().parameters()) b.weights += tensor_bytes(p);
    }
    if (weights) {
      for (const auto& [index, local] : weights->local) {
        bytes[index].optimizer_state =
            state_per_byte * weights->optimizers[local].kept_parameter_bytes();
      }
    }
    MemoryRules rules;
    // Each stage's flat gradient buffer, when its copies sum their gradients (stage_copies.h).
    rules.gradient_buffers = copies > 1 || schedule().replicated();
    rules.recv_ahead = ExecutorOptions().recv_ahead;
    // In the executor's first step its receives know no lengths yet (an asynchronous run's
    // prediction, made once for the whole run, is its steady state's).
    rules.sized_receives = !first_step || asynchronous();
    rules.notice_bytes = static_cast<double>(kNoticeBytes);
    if (!memory_walk) memory_walk.emplace(executor->lowered(), rules.recv_ahead);
    const RankMemory rank =
        pptrain::predict_memory(*memory_walk, bytes, planned.weights, rules)[pipeline_rank];
    if (!asynchronous()) {
      mine.predicted_memory = rank;
    } else {
      async_prediction = rank;
    }
  }
  if (asynchronous()) mine.predicted_memory = *async_prediction;
  // An asynchronous rule steps between backwards: its state is there at the activations' peak.
  mine.predicted_memory.fresh_state = fresh_state && !asynchronous();
  mine.predicted_peak_memory_bytes = std::llround(mine.predicted_memory.total());
}

// What a checkpoint of this schedule records of its layout.
ModuleCheckpoint PipelineSchedule::Impl::layout(int steps_done) const {
  ModuleCheckpoint out;
  out.step = steps_done;
  out.schedule = schedule().name;
  out.num_stages = schedule().num_stages;
  out.pp = ranks();
  out.data_parallel = copies;
  out.zero = options.zero;
  out.optimizer = options.optimizer ? options.optimizer->kind : "";
  out.steps = asynchronous() ? options.steps : 0;
  return out;
}

std::vector<int> PipelineSchedule::saved_stages() const {
  std::vector<int> out;
  for (const Stage* stage : impl_->saved.stages) out.push_back(stage->index());
  return out;
}

void PipelineSchedule::save(const std::string& dir, int steps_done, std::vector<ArchiveFile> files,
                            int keep) {
  Impl& impl = *impl_;
  PPTRAIN_CHECK(keep >= 1, "keep must be >= 1, got ", keep);
  RankCheckpoint mine = impl.weights ? checkpoint() : RankCheckpoint{};
  mine.stages.clear();  // the program's files hold the parameters
  std::vector<std::vector<ArchiveFile>> groups =
      checkpoint_files(mine, steps_done, impl.options.steps, /*copy=*/false);
  groups.push_back(std::move(files));
  save_module_checkpoint(dir, keep, impl.layout(steps_done), groups, *impl.world.transport);
}

ModuleCheckpoint PipelineSchedule::resume(const std::string& dir) {
  Impl& impl = *impl_;
  PPTRAIN_CHECK(!impl.executor, "resume() after the first step");
  const ModuleCheckpoint saved = read_module_checkpoint(dir, "resume");
  const ModuleCheckpoint mine = impl.layout(saved.step);
  const auto expect = [&dir](const std::string& field, const auto& had, const auto& have) {
    PPTRAIN_CHECK(had == have, "resume '", dir, "': the checkpoint's ", field, " is ", had,
                  ", this run's ", have,
                  "; a run continues only under the layout that saved it (load() takes the "
                  "parameters alone, at any layout)");
  };
  expect("schedule", saved.schedule, mine.schedule);
  expect("number of stages", saved.num_stages, mine.num_stages);
  expect("pp", saved.pp, mine.pp);
  expect("data_parallel", saved.data_parallel, mine.data_parallel);
  expect("zero", saved.zero, mine.zero);
  const auto optimizer = [](const std::string& kind) {
    return kind.empty() ? std::string("the program's own") : kind;
  };
  expect("optimizer", optimizer(saved.optimizer), optimizer(mine.optimizer));
  expect("run length (steps)", saved.steps, mine.steps);
  PPTRAIN_CHECK(impl.options.steps == 0 || saved.step < impl.options.steps, "resume '", dir,
                "': the checkpoint is at step ", saved.step, " and the run has ",
                impl.options.steps, " steps: nothing is left to run");
  impl.options.first_step = saved.step;
  impl.next_step = saved.step;
  if (impl.weights) resume_from(dir);
  return saved;
}

void PipelineSchedule::resume_from(const std::string& dir) {
  Impl& impl = *impl_;
  PPTRAIN_CHECK(impl.weights, "optimizer state: set PipelineOptions::optimizer");
  PPTRAIN_CHECK(!impl.executor, "resume_from() after the first step");
  for (auto& optimizer : impl.weights->optimizers) optimizer.load(dir);
  // A tied parameter's state is stored once, with its first copy.
  std::vector<StageOptimizer*> optimizers;
  for (auto& optimizer : impl.weights->optimizers) optimizers.push_back(&optimizer);
  impl.tied.agree_state(optimizers);
  // fp16 goes on at the scale it had; a checkpoint of another precision has none, and the scale
  // starts at its first value.
  if (impl.loss_scale && std::filesystem::exists(loss_scale_file(dir))) {
    impl.loss_scale->load_state(read_tensor_file(loss_scale_file(dir), "--resume"), "--resume");
  }
  if (!impl.asynchronous()) return;
  PPTRAIN_CHECK(impl.tied.empty(), "tied parameters under ", impl.schedule().name,
                " cannot resume: their checkpoints are taken after the run's last step only");
  NamedTensors state = read_tensor_file(in_flight_file(dir, impl.pipeline_rank), "--resume");
  impl.async->load_state(state, "--resume");
  impl.resumed = std::move(state);
}

torch::Tensor PipelineSchedule::step(const TensorBundle& inputs, const TensorBundle& targets) {
  PPTRAIN_CHECK(!impl_->asynchronous(), schedule().name,
                " is asynchronous: its first stage reads ahead into later steps' batches, so "
                "give step() a BatchSource");
  return step([&inputs, &targets](int) { return Batch{inputs, targets}; });
}

torch::Tensor PipelineSchedule::step(const BatchSource& batches) {
  Impl& impl = *impl_;
  PPTRAIN_CHECK(!impl.finished, "step() after finish()");
  PPTRAIN_CHECK(impl.options.steps == 0 || impl.next_step < impl.options.steps, "step ",
                impl.next_step + 1, " of a run of ", impl.options.steps, " steps");
  const int step = impl.next_step;
  const StepData data = impl.step_data(step, batches);
  Transport& transport = *impl.world.transport;
  const bool first_step = !impl.executor;
  if (first_step) impl.start(impl.batch_rows);
  // An asynchronous pipeline never waits for the other ranks between steps: only before the
  // first.
  if (!impl.asynchronous() || first_step) {
    if (impl.weights && !impl.asynchronous()) {
      for (auto& p : impl.weights->params) p.mutable_grad().zero_();
    }
    transport.barrier();  // a common start, so the ranks' timelines line up
    impl.step_start = Clock::now();
  }
  bool fresh_state = true;  // no optimizer state yet: the update makes it (memory_model.h)
  if (impl.weights) {
    for (const auto& optimizer : impl.weights->optimizers) {
      if (optimizer.state_bytes() > 0) fresh_state = false;
    }
  }
  release_unused_blocks();  // large blocks the last step kept but did not take (memory.h)
  const int64_t base_bytes = allocated_bytes();
  reset_peak();
  if (impl.loss_scale) {
    impl.executor->set_loss_scale(impl.loss_scale->scale() *
                                  overflow_factor_for_test(step, impl.world.rank));
  }
  StepRecord record = impl.executor->run_step(data, impl.step_start);
  RankStep mine;
  mine.peak_activation_bytes = peak_bytes() - base_bytes;
  mine.events = std::move(record.events);
  double grad_norm = 0;
  if (!impl.asynchronous()) {
    grad_norm = impl.update(step, record, mine);
    mine.weight_bytes = impl.weight_bytes;
  } else {
    mine.grad_norm_squared = impl.async->grad_norm_squared();
    mine.weight_versions = impl.async->take_most_held();
    mine.weight_bytes = impl.async->take_weight_bytes();
    if (step + 1 == impl.options.steps) impl.async->finish(impl.options.steps);
  }
  mine.peak_memory_bytes = peak_bytes() + impl.uncounted_parameter_bytes;  // before a save's copies
  impl.predict_memory(record, data, first_step, fresh_state, mine);
  if (impl.options.at_step_end) mine.checkpoint_stall_s = impl.options.at_step_end(step + 1);
  mine.resident_bytes = resident_bytes();
  mine.bytes_sent = record.bytes_sent + impl.combine->take_bytes_sent();
  mine.compute_s = record.compute_cpu_s;
  impl.last_compute_wall_s = record.costs.compute_s;
  mine.seconds = seconds_since(impl.step_start);
  if (impl.weights) {
    for (const auto& optimizer : impl.weights->optimizers) {
      mine.optimizer_state_bytes += optimizer.state_bytes();
    }
  }
  mine.start_s = std::chrono::duration<double>(impl.step_start.time_since_epoch()).count();
  mine.has_loss = record.has_loss;
  mine.loss = record.loss;
  RunInfo run = impl.run;
  if (run.tokens_per_sample == 0) run.tokens_per_sample = static_cast<double>(impl.batch_tokens);
  const auto report = gather_step_report(run, step, grad_norm, mine, transport,
                                         impl.asynchronous() ? &impl.unsent_reports : nullptr);
  if (report) {
    for (StepObserver* o : impl.options.observers) o->on_step(*report);
  }
  for (auto& sent : impl.older_reports) sent.wait();
  impl.older_reports = std::move(impl.unsent_reports);
  impl.unsent_reports.clear();
  if (impl.asynchronous()) impl.step_start = Clock::now();  // the next segment starts here
  ++impl.next_step;
  if (!record.has_loss) return torch::Tensor();
  return torch::tensor(record.loss, torch::kFloat64);
}

void PipelineSchedule::abandon() {
  impl_->finished = true;
}

double PipelineSchedule::last_compute_wall_s() const {
  return impl_->last_compute_wall_s;
}

void PipelineSchedule::finish() {
  Impl& impl = *impl_;
  if (impl.finished) return;
  impl.finished = true;
  for (auto& sent : impl.older_reports) sent.wait();
  impl.older_reports.clear();
  if (!impl.executor) return;
  impl.world.transport->barrier();
  if (impl.world.rank != 0) return;
  for (StepObserver* o : impl.options.observers) o->on_end(impl.run);
}

}  // namespace pptrain
