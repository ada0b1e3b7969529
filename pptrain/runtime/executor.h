// Runs one rank's part of a lowered schedule, one training step at a time.
//
// The Executor is the only place a schedule is executed: GPipe, 1F1B, interleaved and
// zero-bubble schedules are just different action lists. Per action:
//   F s m        forward of stage s on microbatch m; keeps the stage input (its floating-point
//                tensors requiring grad) and output for the backward. The first stage reads
//                the data, the last computes loss / M (so gradients accumulate to the mean over
//                the mini-batch). A stage's input and output are TensorBundles
//                (models/tensor_bundle.h): any number of tensors of any dtype and shape.
//                With ExecutorOptions::recompute, F runs without autograd and keeps only the
//                stage input; I or B first reruns the forward with autograd from that input
//                (the rerun is part of the I or B event, so measured times include it).
//   B s m        full backward of the stage: input gradient and weight gradients.
//   I s m        the same backward under DeferWeightGrads: only the input gradient; the weight
//                gradients wait as closures in the (stage, microbatch) store...
//   W s m        ... until W runs them, which frees what they hold. (With
//                ExecutorOptions::weight_split kAutograd, any module: I takes the input gradient
//                alone from autograd, W the weight gradients from the graph I kept.)
//   SEND_* s m   non-blocking send of the bundle (one message: a header with the tensors' names,
//                dtypes and shapes, and their bytes); waited on (letting its tensors go) once a
//                message from the peer shows that it posted the receive, at the latest at the step
//                end.
//   RECV_* s m   waits for the message, its receive posted ahead at the length of the tag's
//                last message (runtime/tensor_bundle.h): shapes may change from message to
//                message (dtypes may not), at one round trip more when the length does.
//   OVERLAP_F_B  runs its parts in order.
//   REDUCE_GRAD s  starts the sum of stage s's gradients over its data-parallel copies through
//                ExecutorOptions::reduce_gradients and goes on; the caller waits for it. Its
//                event covers the start only.
// When adjacent stages live on the same rank (a V placement) the tensor is handed over locally.
// Gradients accumulate in the parameters' .grad over the step; the caller clips and steps.
//
// An asynchronous schedule (no flush) is one list over the whole run, its microbatches numbered
// 0 .. N-1 across steps: with ExecutorOptions::microbatches_per_step = M < N, each run_step()
// runs the next of N / M segments, segment k ending on each rank after its last action on a
// microbatch of step k (so later steps' forwards already run in it), and what is in flight
// carries over to the next call. The `weights` and `after_backward` hooks let the caller choose
// the weight version of each forward and backward and step its optimizers between backwards.
// Between two segments, in_flight() gives what is in flight on this rank, and a new Executor in
// another process continues from it with resume() (a checkpoint of an asynchronous run).
//
//   ExecutorOptions options;
//   options.rank = 0;
//   options.stages = {&stage0, &stage3};
//   options.transport = transport.get();
//   options.loss = bundle_loss(loss);
//   Executor executor(validate(schedule), options);
//   StepRecord record = executor.run_step(data, step_start);
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "pptrain/planner/run_request.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/tensor_bundle.h"
#include "pptrain/runtime/tensor_file.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/timeline.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/memory_model.h"

namespace pptrain {

// Loss of one microbatch: the last stage's output against the targets (a mean over elements).
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
// The same for a last stage that outputs a bundle, or targets that are one.
using BundleLossFn =
    std::function<torch::Tensor(const TensorBundle& output, const TensorBundle& target)>;
// `loss` on the one tensor of each (UserError naming the bundles when either holds more).
BundleLossFn bundle_loss(LossFn loss);

// SkipConnection and skip_links(): planner/run_request.h.

struct ExecutorOptions {
  // This process's rank in the schedule, 0 .. num_ranks-1.
  int rank = 0;
  // This rank's stages, exactly schedule.stages_of(rank) (in any order). Not owned: they must
  // outlive the Executor, and their parameters' .grad is where the gradients accumulate.
  std::vector<Stage*> stages;
  // How this rank reaches the others; not owned. May stay null when this rank has no SEND or
  // RECV (a one-rank schedule).
  Transport* transport = nullptr;
  // Loss of one microbatch on the last stage. Needed on the rank that holds the last stage.
  BundleLossFn loss;
  // Receives posted before the action that consumes them, counted from the current position:
  // more overlaps communication further but holds more buffers. -1: the whole step's at once.
  int recv_ahead = 4;
  // Activation recomputation: between a microbatch's F and its I or B a stage holds only its
  // input (and the output it sent, until the send is known to be done), not the autograd graph.
  bool recompute = false;
  // Microbatches per step, M: the loss of each is divided by M. 0: the schedule's count (one
  // segment per run_step). Smaller for an asynchronous schedule: the schedule's count must be a
  // multiple of it.
  int microbatches_per_step = 0;
  // The stage whose weights the forward (backward = false) or the backward of (stage,
  // microbatch) runs on; unset: the stage given in `stages`. The backward runs on the graph its
  // forward built, so `backward` matters only when recomputing.
  std::function<Stage&(int stage, int microbatch, bool backward)> weights;
  // Called after each backward (B) of (stage, microbatch), its gradients left on the weights it
  // ran on. Only for schedules without I/W split.
  std::function<void(int stage, int microbatch)> after_backward;
  // How I and W divide a backward.
  //   kDeferredLayers: I runs the backward once while the PipeLinear layers (models/pipe_linear.h)
  //     leave their weight gradients as closures for W; other layers compute theirs in I. The
  //     fast path, for pptrain's own models.
  //   kAutograd: for any module. I asks autograd for the input gradient only and keeps the
  //     graph; W then runs the backward from the same output to the stage's parameters. Two
  //     passes over the graph, as torch.distributed.pipelining splits them. On the first stage,
  //     which has no input gradient to send, I does nothing and W the whole backward.
  enum class WeightSplit { kDeferredLayers, kAutograd };
  WeightSplit weight_split = WeightSplit::kDeferredLayers;
  // Stages > 0 that also take tensors straight from the batch's inputs (ids, masks): stage ->
  // the names of StepData::inputs' tensors its input gets beside what the previous stage sent
  // (a named bundle). They carry no gradient back.
  std::map<int, std::vector<std::string>> batch_inputs;
  // Tensors of a stage's output that go to a later stage directly. Synchronous schedules only
  // (one segment), whose Schedule::skips are skip_links(skips). InternalError for a skip outside
  // the stages or backwards; UserError when the stage's output has no tensor of that name.
  std::vector<SkipConnection> skips;
  // Starts the all-reduce of `stage`'s gradients (REDUCE_GRAD) and returns without waiting.
  // Needed when the schedule has reductions (schedule/reductions.h).
  std::function<void(int stage)> reduce_gradients;
  // A bf16 or fp16 run (device/precision.h): the stages' forwards run in that dtype
  // (Stage::forward), so their outputs, the messages and their gradients are in it; the loss is
  // computed on the last stage's output cast back to float32. Unset: float32 throughout.
  std::optional<c10::ScalarType> compute_dtype;
  // With compute_dtype: stage -> the tensors of its output (a named bundle) that stay as they
  // are (PipelineStage::keep_dtype).
  std::map<int, std::vector<std::string>> kept_dtype;
  // With compute_dtype, on a synchronous schedule: each weight is cast to the compute dtype once
  // per step (device/precision.h, StepCasts) and the copy shared by all the step's microbatches
  // and their backwards, instead of once per use. Costs the copies' bytes for the whole step.
  // UserError on an asynchronous schedule (its weight versions are rewritten in place).
  bool casts_per_step = false;
  // Where this rank's stages compute (device/placement.h), and so where StepData's tensors must
  // be. A message is packed into host memory (copied off the device) and unpacked there, then
  // moved to this device: the host staging of runtime/links.h. Stages of one rank hand their
  // tensors over on the device.
  torch::Device device = torch::kCPU;
};

// The data of one step, split into microbatches. `inputs` is needed on the rank holding stage 0
// (and on a rank of a stage with batch_inputs), `targets` on the rank holding the last stage;
// other ranks may pass them empty.
struct StepData {
  std::vector<TensorBundle> inputs;   // [M] x gpt: int64 [mb, T]; mlp: float [mb, D]
  std::vector<TensorBundle> targets;  // [M]
  int first_microbatch = 0;           // microbatch number of inputs[0] and targets[0]
};

// Bytes of tensors around one action of a step (the counting allocator, device/memory.h): for
// a compute action what it left allocated (after - before, negative when it freed more) and
// the most it held above both ends; for a RECV_F of a cut the message received (its bytes were
// allocated when the receive was posted, and its tensors are the stage's input); for a SEND_F
// the message sent (runtime/tensor_bundle.h: message_bytes; skip messages: neither).
struct ActionBytes {
  Action action;
  int64_t kept = 0;
  int64_t transient = 0;
};

// Where one step's wall time went on this rank, in seconds, from the executor's own clock reads
// (a few tens of nanoseconds each). What run_step spent outside these parts is the executor's
// bookkeeping: finding slots, recording events, handing tensors over. bench/executor_bench.cpp
// divides them by the counts to give an action's and a message's cost.
struct StepCosts {
  double total_s = 0;      // the whole run_step
  double compute_s = 0;    // inside F, I, W, B: the stages' layers, the loss, autograd
  double post_s = 0;       // posting receives ahead: a buffer and the transport's recv
  double send_s = 0;       // SEND actions: the message packed and the transport's send posted
  double recv_wait_s = 0;  // RECV actions: waiting for the message (and its transfer), unpacking
  double send_wait_s = 0;  // waiting on sends: after a receive proves their arrival, at the end
  int compute_actions = 0;
  int sends = 0;
  int receives = 0;
  double bookkeeping_s() const {
    return total_s - compute_s - post_s - send_s - recv_wait_s - send_wait_s;
  }
  StepCosts& operator+=(const StepCosts& other);
};

struct StepRecord {
  bool has_loss = false;  // true on the rank that holds the last stage
  double loss = 0;        // mean loss over the mini-batch (sum over microbatches of loss_m / M)
  std::vector<TimelineEvent> events;  // every action run, seconds since the step start
  int64_t bytes_sent = 0;             // of the tensors its SEND actions sent (not the headers)
  double compute_cpu_s = 0;           // thread CPU seconds of its F, I, W and B actions
  // Its F, I, W, B and RECV_F actions' bytes, in order; empty without the counting allocator.
  std::vector<ActionBytes> action_bytes;
  StepCosts costs;
};

// What one microbatch holds on each stage in the step, read off `bytes` (StepRecord::
// action_bytes) for the memory model (sim/memory_model.h): activation = the median of a
// stage's F kept bytes, plus the mean input it received; weight_stash = the median of what its
// W freed; transient and forward_transient = the most any of its backwards (I, B, W) or
// forwards held above their ends; message = the mean
// message into it, received or sent; with casts_per_step, weight_casts = what its first F kept
// beyond the median of the others (the step's casts of its weights, made there), that F left
// out of the activation's median. Only those fields are set; a stage without actions in
// `bytes` stays zero. [num_stages]
std::vector<StageBytes> measured_stage_bytes(const std::vector<ActionBytes>& bytes, int num_stages,
                                             bool casts_per_step = false);

class Executor {
 public:
  // `schedule`: validated, so with its SEND/RECV actions and every rule of validate.h holding.
  // InternalError when `options` does not fit it (wrong stages, missing transport, loss or
  // shapes); UserError when it has too many messages for the transport's tags.
  Executor(ValidatedSchedule schedule, ExecutorOptions options);
  ~Executor();

  // Runs the next segment (the whole list for a synchronous schedule). Event times are seconds
  // since `step_start`.
  StepRecord run_step(const StepData& data, std::chrono::steady_clock::time_point step_start);

  const Schedule& schedule() const { return *schedule_; }
  const ValidatedSchedule& lowered() const { return schedule_; }

  // fp16's loss scale (train/loss_scale.h): the backwards of the steps from now on start from
  // a gradient of `scale` instead of 1, so every gradient is `scale` times the true one; the
  // losses reported stay unscaled. 1 by default.
  void set_loss_scale(double scale) { loss_scale_ = scale; }

  // Between two segments of an asynchronous schedule whose step ends form clean cuts
  // (schedule/semantics.h: first_crossed_step): what this rank holds that the rest of the run
  // needs. Each microbatch in flight, its stage input (the data on stage 0) and whether its
  // forward ran, or the output gradient that came for its backward; and each message this rank
  // sent that its receiver takes only in a later segment.
  NamedTensors in_flight() const;
  // Before the first run_step of a new Executor: go on after `segments_done` segments from what
  // in_flight() gave after them (in another process, on stages holding the same weights).
  // Re-sends the messages now; a forward in flight rebuilds its graph at the next run_step, on
  // the weights the `weights` hook gives it (the version it ran on: the same output, bit for
  // bit), without counting its loss again. UserError starting with `flag` for a state that does
  // not fit the schedule.
  void resume(int segments_done, const NamedTensors& in_flight, const std::string& flag);

 private:
  struct Slot;  // what one (stage, microbatch) holds during a step
  struct StepState;

  void run_action(const Action& action, size_t position, const StepData& data, StepState& state);
  void plan_send_releases();
  void forward(int stage, int mb, const StepData& data, StepState& state);
  // The stage's layers on `input`, and on the last stage the loss / M against the targets
  // (a bundle of one scalar). UserError naming the stage and where its input came from when
  // the stage cannot take it; and when its output's tensors change names or dtypes.
  TensorBundle stage_output(int stage, int mb, const TensorBundle& input, const StepData& data,
                            bool backward);
  void plan_segments();
  // The forwards in flight that resume() took over, run again to rebuild their graphs.
  void replay_forwards(const StepData& data, StepState& state);
  void backward(int stage, int mb, bool defer_weight_grads, const StepData& data, StepState& state);
  // W: the deferred closures, or (WeightSplit::kAutograd) the pass to the stage's parameters.
  void weight_backward(int stage, int mb, StepState& state);
  void post_receives_through(size_t position, StepState& state);
  // Sends `bundle` as the message of our SEND at `position`, counting its bytes in the record.
  PendingComm send(size_t position, const TensorBundle& bundle, StepState& state);
  // "the output of stage 1 to stage 2 (microbatch 0)" and the like, for errors about what a
  // RECV brought.
  std::string origin_of(const Action& recv) const;
  // `input` with the batch's tensors that stage s takes (batch_inputs).
  TensorBundle with_batch_inputs(int stage, int mb, const TensorBundle& input,
                                 const StepData& data) const;
  // Skip connections: whether one needs messages (it goes past the next stage); a check of
  // them against the schedule; the output without the tensors that skip; the skipping tensors
  // kept for the skip SEND_F or handed over after F s m, and merged into the input of F s m;
  // the gradients of I/B s m that go back, and those that came for its output.
  bool is_skip(const SkipConnection& skip) const;
  void check_skips() const;
  TensorBundle next_stage_part(int stage, const TensorBundle& output) const;
  void send_skips(int stage, int mb, const TensorBundle& output, StepState& state);
  // A skip message's SEND_F or SEND_B: what forward or backward left for the other end.
  void send_skip_message(const Action& send, size_t position, StepState& state);
  void take_skips(int stage, int mb, StepState& state);
  void return_skip_grads(int stage, int mb, StepState& state);
  std::vector<torch::Tensor> output_grads(int stage, int mb, StepState& state);
  // UserError when stage s's output differs from its first in names or dtypes.
  void check_output_kinds(int stage, const TensorBundle& output);
  Slot& slot(StepState& state, int stage, int mb);
  // Whether this rank runs `stage` for microbatch `mb` (a replicated stage runs on several).
  bool is_local(int stage, int mb) const { return schedule_->rank_of(stage, mb) == options_.rank; }
  // The rank at the other end of a SEND or RECV.
  int peer_rank(const Action& comm) const;

  ValidatedSchedule schedule_;
  ExecutorOptions options_;
  std::map<int, Stage*> stages_;  // global stage index -> stage
  // Tag of each of our SEND/RECV actions by position (-1 for compute actions): worked out once,
  // so a schedule too large for the tags fails here rather than halfway through a step.
  std::vector<int> tags_;
  MessageLengths message_lengths_;  // of each tag's last message, sent and received
  // Position of one of our RECVs -> positions of our SENDs safe to wait on once it completed.
  std::map<size_t, std::vector<size_t>> release_after_;
  std::vector<size_t> posted_before_;  // [position]: receives posted before it runs
  int microbatches_per_step_ = 0;
  double loss_scale_ = 1;  // set_loss_scale()
  // End position (exclusive) of each segment of our list; the last is the list's size.
  std::vector<size_t> segment_ends_;
  size_t next_segment_ = 0;
  // Our SENDs whose message is received in a later segment than the one sending it: position ->
  // the receiver's segment. What they sent is kept (retained_) until a cut after the receive.
  std::map<size_t, size_t> crossing_;
  std::map<size_t, TensorBundle> retained_;
  // Each stage's output as first produced: its tensors' names and dtypes must stay the same
  // (shapes may change), so that a receiver never takes one tensor for another.
  std::map<int, TensorBundle> output_kinds_;
  // (stage, microbatch) of forwards resume() took over that still need their graph.
  std::vector<std::pair<int, int>> to_replay_;
  std::unique_ptr<StepState> state_;  // the run in progress, between segments
};

}  // namespace pptrain
