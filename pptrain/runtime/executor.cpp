#include "pptrain/runtime/executor.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/stats.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/memory.h"
#include "pptrain/device/precision.h"
#include "pptrain/models/autograd_split.h"
#include "pptrain/models/weight_grad_store.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {

using Clock = std::chrono::steady_clock;

namespace {

const std::vector<std::string> kNoNames;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The same tensors without their graph.
TensorBundle detached(const TensorBundle& bundle) {
  TensorBundle out = bundle;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].defined()) out[i] = out[i].detach();
  }
  return out;
}

// A stage input's floating-point tensors become leaves whose gradient the backward leaves in
// .grad(); ids and masks stay as they are.
void requires_grad_on_floats(TensorBundle& input) {
  for (size_t i = 0; i < input.size(); ++i) {
    if (carries_gradient(input[i])) input[i].requires_grad_(true);
  }
}

bool has_gradient_carrier(const TensorBundle& bundle) {
  for (const auto& t : bundle.tensors()) {
    if (carries_gradient(t)) return true;
  }
  return false;
}

// One gradient per tensor of `forward` from the backward message `grads` (gradient_bundle's
// layout): undefined for the tensors that carry none. UserError naming `what` when the message
// does not fit the tensors it answers.
std::vector<torch::Tensor> gradients_for(const TensorBundle& forward, const TensorBundle& grads,
                                         const std::string& what) {
  std::vector<torch::Tensor> out(forward.size());
  size_t next = 0;
  for (size_t i = 0; i < forward.size(); ++i) {
    if (!carries_gradient(forward[i])) continue;
    PPTRAIN_CHECK(next < grads.size(), what, " has ", grads.size(),
                  " tensors, but the output has more floating-point ones (", forward.describe(),
                  ")");
    const torch::Tensor& g = grads[next++];
    PPTRAIN_CHECK(!g.defined() || g.sizes() == forward[i].sizes(), what, ": the gradient of ",
                  forward.label(i), " has shape ", g.sizes(), ", the tensor ", forward[i].sizes());
    out[i] = g;
  }
  PPTRAIN_CHECK(next == grads.size(), what, " has ", grads.size(), " tensors, but the output has ",
                next, " floating-point ones (", forward.describe(), ")");
  return out;
}

// The first line of an exception's message (c10 errors: without their backtrace).
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

StepCosts& StepCosts::operator+=(const StepCosts& other) {
  total_s += other.total_s;
  compute_s += other.compute_s;
  post_s += other.post_s;
  send_s += other.send_s;
  recv_wait_s += other.recv_wait_s;
  send_wait_s += other.send_wait_s;
  compute_actions += other.compute_actions;
  sends += other.sends;
  receives += other.receives;
  return *this;
}

BundleLossFn bundle_loss(LossFn loss) {
  return [loss = std::move(loss)](const TensorBundle& output, const TensorBundle& target) {
    return loss(output.only(), target.only());
  };
}

struct Executor::Slot {
  TensorBundle input;        // stage input; floating-point leaves with requires_grad on stages > 0
  TensorBundle output;       // stage output, or loss / M on the last stage
  TensorBundle output_grad;  // gradients of `output` (gradient_bundle): RECV_B or the next stage
  TensorBundle input_grad;   // gradients of `input` (gradient_bundle), waiting for SEND_B
  bool forwarded = false;    // F ran and no backward yet
  WeightGradStore weight_grads;  // I's deferred weight gradients, run by W
  // Skip connections: the tensors that came for this stage's input (merged into `input` by F),
  // and the gradients that came for this stage's output's skipping tensors, by name; what its
  // skip messages carry to a stage on another rank (by that stage), waiting for their SEND.
  TensorBundle skip_inputs;
  std::map<std::string, torch::Tensor> skip_output_grads;
  std::map<int, TensorBundle> skip_outputs;
  std::map<int, TensorBundle> skip_input_grads;
  WeightPass weight_pass;  // WeightSplit::kAutograd: what I kept for W
};

struct Executor::StepState {
  Clock::time_point start;
  std::map<std::pair<int, int>, Slot> slots;  // (stage, microbatch) -> slot
  std::vector<size_t> recv_positions;         // positions of this rank's RECV actions, in order
  size_t next_recv = 0;                       // index into recv_positions: next one to post
  std::map<size_t, BundleReceive> posted;     // position of a RECV -> its posted receive
  std::map<size_t, PendingComm> sent;         // position of a SEND -> the send in flight
  StepRecord record;
};

Executor::Executor(ValidatedSchedule schedule, ExecutorOptions options)
    : schedule_(std::move(schedule)), options_(std::move(options)) {
  const Schedule& sched = *schedule_;
  const int rank = options_.rank;
  PPTRAIN_ASSERT(rank >= 0 && rank < sched.num_ranks, "rank ", rank, " is not in a schedule of ",
                 sched.num_ranks, " ranks");
  for (Stage* stage : options_.stages) stages_[stage->index()] = stage;
  std::vector<int> held;
  for (const auto& [index, stage] : stages_) held.push_back(index);
  PPTRAIN_ASSERT(held == sched.stages_of(rank), "rank ", rank, " was given the wrong stages");
  PPTRAIN_ASSERT(options_.loss || !stages_.count(sched.num_stages - 1),
                 "the rank of the last stage needs a loss function");
  PPTRAIN_ASSERT(
      options_.weight_split == ExecutorOptions::WeightSplit::kDeferredLayers || !options_.weights,
      "the autograd weight split runs on the stages' own weights, not on versions");
  const auto& mine = sched.actions[rank];
  tags_.assign(mine.size(), -1);
  for (size_t p = 0; p < mine.size(); ++p) {
    if (!is_comm(mine[p].op)) continue;
    PPTRAIN_ASSERT(options_.transport != nullptr, "rank ", rank, " communicates (",
                   to_string(mine[p]), ") but has no transport");
    tags_[p] = message_tag(mine[p], sched);
  }
  microbatches_per_step_ =
      options_.microbatches_per_step > 0 ? options_.microbatches_per_step : sched.num_microbatches;
  PPTRAIN_ASSERT(sched.num_microbatches % microbatches_per_step_ == 0, "a schedule of ",
                 sched.num_microbatches, " microbatches is not made of steps of ",
                 microbatches_per_step_);
  plan_send_releases();
  plan_segments();
  check_skips();
  PPTRAIN_CHECK(!options_.casts_per_step || (segment_ends_.size() == 1 && !options_.weights),
                "weights cast once per step are for synchronous schedules: ", sched.name,
                " runs microbatches on weight versions that change within a step");
}

Executor::~Executor() = default;

// Segment k ends after our last action on a microbatch of steps 0..k (schedule/semantics.h).
// Segments may be empty (a rank can run all of a step's work in an earlier segment). A message
// sent in one segment and received in a later one is kept beside the send, so that in_flight()
// can hand it to a checkpoint.
void Executor::plan_segments() {
  const Schedule& sched = *schedule_;
  segment_ends_ = step_segment_ends(sched, options_.rank, microbatches_per_step_);
  if (segment_ends_.size() == 1) return;  // synchronous: one segment
  const MessageSegments segments = message_segments(sched, microbatches_per_step_);
  const auto& mine = sched.actions[options_.rank];
  for (size_t p = 0; p < mine.size(); ++p) {
    if (!is_send(mine[p].op)) continue;
    const size_t index = message_index(mine[p], sched);
    if (segments.received_in[index] > segments.sent_in[index])
      crossing_[p] = static_cast<size_t>(segments.received_in[index]);
  }
}

// A send holds its tensor until it is waited on, and waiting too early could block this rank on
// a peer that first needs something from it. It is safe once the peer has posted the matching
// receive: Gloo moves the data then on its own, so waiting costs at most the transfer. A rank
// posts every receive up to its current position before it runs that action, so any message
// the peer sends from a later position than that receive proves it posted. We wait on a send
// right after the first of our receives that carries such a message; a send without one is
// waited on at the step end.
void Executor::plan_send_releases() {
  release_after_ = send_releases(*schedule_, options_.rank);
  posted_before_ = receives_posted(schedule_->actions[options_.rank], options_.recv_ahead);
}

int Executor::peer_rank(const Action& comm) const {
  return rank_of_peer(*schedule_, comm);
}

PendingComm Executor::send(size_t position, const TensorBundle& bundle, StepState& state) {
  const Action& action = schedule_->actions[options_.rank][position];
  return send_bundle(*options_.transport, bundle, peer_rank(action), tags_[position],
                     message_lengths_, &state.record.bytes_sent);
}

std::string Executor::origin_of(const Action& recv) const {
  const bool backward = recv.op == Op::RECV_B;
  const int from = comm_peer(recv).stage, to = recv.stage;
  const std::string what = is_skip_message(recv) ? (backward ? "the skip gradient from stage "
                                                             : "the skip tensors of stage ")
                           : backward            ? "the gradient from stage "
                                                 : "the output of stage ";
  return what + std::to_string(from) + " to stage " + std::to_string(to) + " (microbatch " +
         std::to_string(recv.microbatch) + ")";
}

Executor::Slot& Executor::slot(StepState& state, int stage, int mb) {
  PPTRAIN_ASSERT(mb >= 0 && mb < schedule_->num_microbatches && is_local(stage, mb), "stage ",
                 stage, " microbatch ", mb, " is not run on rank ", options_.rank);
  return state.slots[{stage, mb}];
}

StepRecord Executor::run_step(const StepData& data, Clock::time_point step_start) {
  const Clock::time_point called = Clock::now();
  const auto& actions = schedule_->actions[options_.rank];
  if (!state_) {
    state_ = std::make_unique<StepState>();
    for (size_t p = 0; p < actions.size(); ++p) {
      if (actions[p].op == Op::RECV_F || actions[p].op == Op::RECV_B)
        state_->recv_positions.push_back(p);
    }
  }
  StepState& state = *state_;
  state.start = step_start;
  state.record = StepRecord();
  const size_t begin = next_segment_ == 0 ? 0 : segment_ends_[next_segment_ - 1];
  const size_t end = segment_ends_[next_segment_];
  // The weights do not change until the step ends: one cast of each serves all its actions.
  const StepCasts casts(options_.casts_per_step ? options_.compute_dtype : std::nullopt);
  replay_forwards(data, state);
  for (size_t p = begin; p < end; ++p) {
    post_receives_through(p, state);
    const Action& action = actions[p];
    if (is_recv(action.op)) {
      // The receive was posted ahead; what remains is waiting for it.
      const Clock::time_point waiting = Clock::now();
      const double begin_s = seconds_between(state.start, waiting);
      auto it = state.posted.find(p);
      PPTRAIN_ASSERT(it != state.posted.end());
      Slot& s = slot(state, action.stage, action.microbatch);
      TensorBundle got = on_device(it->second.finish(), options_.device);
      state.posted.erase(it);
      const Clock::time_point got_it = Clock::now();
      state.record.costs.recv_wait_s += seconds_between(waiting, got_it);
      ++state.record.costs.receives;
      if (!is_skip_message(action)) {
        if (action.op == Op::RECV_F && counting_allocator_installed()) {
          state.record.action_bytes.push_back({action, message_bytes(got), 0});
        }
        (action.op == Op::RECV_F ? s.input : s.output_grad) = std::move(got);
      } else {
        for (size_t i = 0; i < got.size(); ++i) {
          if (action.op == Op::RECV_F) s.skip_inputs.add(got.label(i), got[i]);
          if (action.op == Op::RECV_B) s.skip_output_grads[got.label(i)] = got[i];
        }
      }
      const auto released = release_after_.find(p);
      if (released != release_after_.end()) {
        const Clock::time_point releasing = Clock::now();
        for (size_t send : released->second) {
          auto sent = state.sent.find(send);
          if (sent == state.sent.end()) continue;
          sent->second.wait();
          state.sent.erase(sent);
        }
        state.record.costs.send_wait_s += seconds_between(releasing, Clock::now());
      }
      const double end_s = seconds_between(state.start, Clock::now());
      state.record.events.push_back({options_.rank, action, begin_s, end_s});
      continue;
    }
    for (const Action& atom : atoms_of(action)) run_action(atom, p, data, state);
  }
  StepRecord record = std::move(state.record);
  // What was received by the end of this segment need not be kept any longer.
  for (auto it = retained_.begin(); it != retained_.end();) {
    it = crossing_.at(it->first) <= next_segment_ ? retained_.erase(it) : std::next(it);
  }
  if (++next_segment_ < segment_ends_.size()) {
    record.costs.total_s = seconds_between(called, Clock::now());
    return record;
  }
  // The end of the list: everything must be delivered before the next run reuses the tags.
  const Clock::time_point releasing = Clock::now();
  for (auto& [position, sent] : state.sent) sent.wait();
  record.costs.send_wait_s += seconds_between(releasing, Clock::now());
  for (auto& [key, s] : state.slots) {
    PPTRAIN_ASSERT(s.weight_grads.empty(), "stage ", key.first, " microbatch ", key.second,
                   " has weight gradients that no W ran");
  }
  PPTRAIN_ASSERT(state.posted.empty() && state.next_recv == state.recv_positions.size());
  state_.reset();
  next_segment_ = 0;
  record.costs.total_s = seconds_between(called, Clock::now());
  return record;
}

namespace {

std::string slot_name(int stage, int mb, const char* what) {
  return "microbatch/" + std::to_string(stage) + "/" + std::to_string(mb) + "/" + what;
}

}  // namespace

NamedTensors Executor::in_flight() const {
  PPTRAIN_ASSERT(to_replay_.empty(), "in_flight() before the resumed executor ran a segment");
  NamedTensors out;
  out["segments_done"] = number_tensor(static_cast<int64_t>(next_segment_));
  if (!state_) return out;
  for (const auto& [key, s] : state_->slots) {
    const auto [stage, mb] = key;
    PPTRAIN_ASSERT(s.weight_grads.empty() && s.weight_pass.empty() && s.input_grad.empty(),
                   "stage ", stage, " microbatch ", mb, " is between a backward and its end");
    put_bundle(slot_name(stage, mb, "input"), s.input, out);
    put_bundle(slot_name(stage, mb, "output_grad"), s.output_grad, out);
    if (s.forwarded) out[slot_name(stage, mb, "forwarded")] = number_tensor(1);
  }
  for (const auto& [position, bundle] : retained_) {
    put_bundle("message/" + std::to_string(position), bundle, out);
  }
  return out;
}

void Executor::resume(int segments_done, const NamedTensors& in_flight, const std::string& flag) {
  PPTRAIN_ASSERT(!state_ && next_segment_ == 0, "resume() after a segment ran");
  PPTRAIN_CHECK(segments_done > 0 && static_cast<size_t>(segments_done) < segment_ends_.size() &&
                    number_of(in_flight, "segments_done", flag) == segments_done,
                flag, ": the state in flight is not that of step ", segments_done, " of ",
                schedule_->name);
  const auto& actions = schedule_->actions[options_.rank];
  next_segment_ = static_cast<size_t>(segments_done);
  const size_t begin = segment_ends_[next_segment_ - 1];
  state_ = std::make_unique<StepState>();
  StepState& state = *state_;
  for (size_t p = 0; p < actions.size(); ++p) {
    if (actions[p].op != Op::RECV_F && actions[p].op != Op::RECV_B) continue;
    state.recv_positions.push_back(p);
    if (p < begin) state.next_recv = state.recv_positions.size();  // received before the cut
  }
  for (const auto& [name, tensor] : in_flight) {
    int stage = 0, mb = 0, position = 0;
    char what[16] = {0};
    if (std::sscanf(name.c_str(), "microbatch/%d/%d/%15[a-z_]", &stage, &mb, what) == 3) {
      PPTRAIN_CHECK(stages_.count(stage) && mb >= 0 && mb < schedule_->num_microbatches &&
                        is_local(stage, mb),
                    flag, ": the state in flight holds stage ", stage, " microbatch ", mb,
                    ", which rank ", options_.rank, " does not run");
      Slot& sl = slot(state, stage, mb);
      const std::string field = what;
      if (field == "input") sl.input = take_bundle(slot_name(stage, mb, "input"), in_flight);
      if (field == "output_grad") {
        sl.output_grad = take_bundle(slot_name(stage, mb, "output_grad"), in_flight);
      }
      if (field == "forwarded" && !sl.forwarded) {
        sl.forwarded = true;
        to_replay_.emplace_back(stage, mb);
      }
    } else if (std::sscanf(name.c_str(), "message/%d", &position) == 1) {
      const size_t p = static_cast<size_t>(position);
      PPTRAIN_CHECK(crossing_.count(p), flag, ": the state in flight holds a message of position ",
                    position, ", which rank ", options_.rank, " does not send across a step");
      if (retained_.count(p)) continue;  // one message, several tensors
      retained_[p] = take_bundle("message/" + std::to_string(p), in_flight);
      state.sent[p] = send(p, retained_[p], state);
    }
  }
}

// A forward in flight keeps its output's graph for the backward; in a new process that graph is
// built again from the stage input. Recomputing, a forward keeps no graph: nothing to do.
void Executor::replay_forwards(const StepData& data, StepState& state) {
  for (const auto& [stage, mb] : to_replay_) {
    Slot& sl = slot(state, stage, mb);
    PPTRAIN_CHECK(!sl.input.empty(), "the state in flight has no input for stage ", stage,
                  " microbatch ", mb, ", whose forward ran");
    if (stage > 0) requires_grad_on_floats(sl.input);
    if (!options_.recompute) sl.output = stage_output(stage, mb, sl.input, data, false);
  }
  to_replay_.clear();
}

void Executor::post_receives_through(size_t position, StepState& state) {
  // The rule (schedule/semantics.h: receives_posted) is shared with the memory model.
  if (state.next_recv >= posted_before_[position]) return;
  const Clock::time_point posting = Clock::now();
  while (state.next_recv < posted_before_[position]) {
    const size_t p = state.recv_positions[state.next_recv++];
    const Action& a = schedule_->actions[options_.rank][p];
    state.posted.emplace(p, BundleReceive(*options_.transport, peer_rank(a), tags_[p], origin_of(a),
                                          message_lengths_));
  }
  state.record.costs.post_s += seconds_between(posting, Clock::now());
}

void Executor::run_action(const Action& action, size_t position, const StepData& data,
                          StepState& state) {
  const double begin = std::chrono::duration<double>(Clock::now() - state.start).count();
  const double cpu_begin = thread_cpu_ms();
  const bool counted = is_compute(action.op) && counting_allocator_installed();
  const int64_t bytes_before = counted ? allocated_bytes() : 0;
  if (counted) reset_window_peak();
  const int s = action.stage, mb = action.microbatch;
  const Clock::time_point body = Clock::now();
  switch (action.op) {
    case Op::F:
      forward(s, mb, data, state);
      break;
    case Op::B:
      backward(s, mb, /*defer_weight_grads=*/false, data, state);
      break;
    case Op::I:
      backward(s, mb, /*defer_weight_grads=*/true, data, state);
      break;
    case Op::W:
      weight_backward(s, mb, state);
      break;
    case Op::SEND_F: {
      if (is_skip_message(action)) {
        send_skip_message(action, position, state);
        break;
      }
      Slot& sl = slot(state, s, mb);
      PPTRAIN_ASSERT(!sl.output.empty(), to_string(action), " on rank ", options_.rank,
                     " sends an output that F has not produced");
      const TensorBundle next = next_stage_part(s, sl.output);
      state.sent[position] = send(position, next, state);
      if (counting_allocator_installed()) {
        state.record.action_bytes.push_back({action, message_bytes(next), 0});
      }
      if (crossing_.count(position)) retained_[position] = detached(next);
      // Recomputing, the graph-free output is needed only by the send, which holds it.
      if (options_.recompute) sl.output = TensorBundle();
      break;
    }
    case Op::SEND_B: {
      if (is_skip_message(action)) {
        send_skip_message(action, position, state);
        break;
      }
      Slot& sl = slot(state, s, mb);
      state.sent[position] = send(position, sl.input_grad, state);
      if (crossing_.count(position)) retained_[position] = sl.input_grad;
      sl.input_grad = TensorBundle();
      break;
    }
    case Op::REDUCE_GRAD:
      // Only starts it: the caller waits for the sums before its optimizer step.
      PPTRAIN_ASSERT(options_.reduce_gradients, to_string(action), " on rank ", options_.rank,
                     " without ExecutorOptions::reduce_gradients");
      options_.reduce_gradients(s);
      break;
    default:
      PPTRAIN_UNREACHABLE("cannot run ", to_string(action));
  }
  const double body_s = seconds_between(body, Clock::now());
  StepCosts& costs = state.record.costs;
  if (is_compute(action.op)) {
    costs.compute_s += body_s;
    ++costs.compute_actions;
  } else if (is_send(action.op)) {
    costs.send_s += body_s;
    ++costs.sends;
  }
  const double end = std::chrono::duration<double>(Clock::now() - state.start).count();
  if (is_compute(action.op)) state.record.compute_cpu_s += (thread_cpu_ms() - cpu_begin) / 1e3;
  if (counted) {
    const int64_t bytes_after = allocated_bytes();
    state.record.action_bytes.push_back(
        {action, bytes_after - bytes_before,
         window_peak_bytes() - std::max(bytes_before, bytes_after)});
  }
  state.record.events.push_back({options_.rank, action, begin, end});
}

TensorBundle Executor::stage_output(int s, int mb, const TensorBundle& input, const StepData& data,
                                    bool backward) {
  Stage& stage = options_.weights ? options_.weights(s, mb, backward) : *stages_.at(s);
  TensorBundle output;
  try {
    const auto kept = options_.kept_dtype.find(s);
    output = stage.forward(with_batch_inputs(s, mb, input, data), options_.compute_dtype,
                           kept == options_.kept_dtype.end() ? kNoNames : kept->second);
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    // The module's own error, on this input: name the stage and where the input came from.
    const std::string from = s == 0 ? "the batch"
                             : stages_.count(s - 1) && is_local(s - 1, mb)
                                 ? "stage " + std::to_string(s - 1) + " on this rank"
                                 : "stage " + std::to_string(s - 1);
    if (dynamic_cast<const ModuleError*>(&e)) {
      throw ModuleError(std::string(e.what()) + "; its input came from " + from + " (" +
                        input.describe() + ")");
    }
    throw UserError("stage " + std::to_string(s) + " cannot take its input from " + from + " (" +
                    input.describe() + "): " + first_line(e));
  }
  const int last = schedule_->num_stages - 1;
  if (s != last) {
    check_output_kinds(s, output);
    return output;
  }
  const int index = mb - data.first_microbatch;
  PPTRAIN_ASSERT(index >= 0 && index < static_cast<int>(data.targets.size()),
                 "no targets for microbatch ", mb);
  // Divided by M so the accumulated gradients are those of the mean over the mini-batch. The loss
  // of a bf16 or fp16 forward is taken in float32, as autocast takes its losses.
  if (options_.compute_dtype) {
    output = with_dtype(std::move(output), *options_.compute_dtype, torch::kFloat32);
  }
  return options_.loss(output, data.targets[index]) / microbatches_per_step_;
}

TensorBundle Executor::with_batch_inputs(int s, int mb, const TensorBundle& input,
                                         const StepData& data) const {
  const auto names = options_.batch_inputs.find(s);
  if (s == 0 || names == options_.batch_inputs.end()) return input;
  const int index = mb - data.first_microbatch;
  PPTRAIN_ASSERT(index >= 0 && index < static_cast<int>(data.inputs.size()),
                 "no batch inputs for microbatch ", mb, " on rank ", options_.rank);
  PPTRAIN_CHECK(input.named(), "stage ", s, " takes ", names->second.front(),
                " from the batch, so stage ", s - 1, " must send it a named bundle, not a list (",
                input.describe(), ")");
  TensorBundle merged = input;
  for (const std::string& name : names->second) {
    PPTRAIN_CHECK(!input.contains(name), "stage ", s, " takes '", name,
                  "' from the batch, but stage ", s - 1, " sends one too");
    merged.add(name, data.inputs[index][name]);
  }
  return merged;
}

void Executor::check_output_kinds(int s, const TensorBundle& output) {
  PPTRAIN_CHECK(!output.empty(), "stage ", s, " returns no tensors, but stage ", s + 1,
                " takes its output");
  const auto known = output_kinds_.find(s);
  if (known == output_kinds_.end()) {
    output_kinds_.emplace(s, detached(output));
    return;
  }
  const TensorBundle& before = known->second;
  const auto kind = [](const TensorBundle& b, size_t i) {
    return b.label(i) + " " +
           (b[i].defined() ? dtype_name(b[i].scalar_type()) : std::string("undefined"));
  };
  bool same = before.size() == output.size() && before.names() == output.names();
  for (size_t i = 0; same && i < output.size(); ++i) same = kind(before, i) == kind(output, i);
  if (same) return;
  size_t i = 0;
  while (i < std::min(before.size(), output.size()) && kind(before, i) == kind(output, i)) ++i;
  const std::string now = i < output.size() ? kind(output, i) : "nothing";
  const std::string was = i < before.size() ? kind(before, i) : "nothing";
  PPTRAIN_CHECK(false, "stage ", s, " changed its output to stage ", s + 1, ": tensor ", i, " is ",
                now, ", but was ", was,
                " before (shapes may change from batch to batch, names and dtypes may not)");
}

void Executor::forward(int s, int mb, const StepData& data, StepState& state) {
  Slot& sl = slot(state, s, mb);
  if (s == 0) {
    const int index = mb - data.first_microbatch;
    PPTRAIN_ASSERT(index >= 0 && index < static_cast<int>(data.inputs.size()),
                   "no input data for microbatch ", mb);
    sl.input = data.inputs[index];
  } else {
    PPTRAIN_ASSERT(!sl.input.empty(), s, "F", mb, " on rank ", options_.rank,
                   " runs before its input arrived (missing RECV_F or forward of stage ", s - 1,
                   ")");
    take_skips(s, mb, state);
    // The input is a leaf of this stage's graph: backward leaves its gradient in input.grad().
    requires_grad_on_floats(sl.input);
  }
  TensorBundle output;
  {
    // Recomputation: no graph now; the backward rebuilds it from sl.input.
    std::optional<torch::NoGradGuard> no_graph;
    if (options_.recompute) no_graph.emplace();
    output = stage_output(s, mb, sl.input, data, /*backward=*/false);
  }
  if (s == schedule_->num_stages - 1) {
    state.record.has_loss = true;
    state.record.loss += output.only().item<double>();
  } else {
    send_skips(s, mb, output, state);
    if (is_local(s + 1, mb)) slot(state, s + 1, mb).input = detached(next_stage_part(s, output));
  }
  sl.forwarded = true;
  // Kept for the backward, or (recomputing) only for SEND_F, which takes it over.
  if (!options_.recompute || (s != schedule_->num_stages - 1 && !is_local(s + 1, mb)))
    sl.output = output;
}

void Executor::backward(int s, int mb, bool defer_weight_grads, const StepData& data,
                        StepState& state) {
  Slot& sl = slot(state, s, mb);
  const int last = schedule_->num_stages - 1;
  PPTRAIN_ASSERT(sl.forwarded, "backward of stage ", s, " microbatch ", mb, " on rank ",
                 options_.rank, " runs before its forward (or twice)");
  // Same input, same layers, same thread count: the rerun reproduces F's output bit for bit.
  if (options_.recompute) sl.output = stage_output(s, mb, sl.input, data, /*backward=*/true);
  PPTRAIN_ASSERT(
      s == last || !sl.output_grad.empty() || !has_gradient_carrier(next_stage_part(s, sl.output)),
      "backward of stage ", s, " microbatch ", mb, " on rank ", options_.rank,
      " runs before its output gradient arrived (missing RECV_B or backward of stage ", s + 1, ")");
  // The outputs to run the backward from, with their gradients (the last stage: the loss).
  std::vector<torch::Tensor> roots, grads;
  if (s == last) {
    roots.push_back(sl.output.only());
    if (loss_scale_ != 1) grads.push_back(torch::full_like(roots.back(), loss_scale_));
  } else {
    const std::vector<torch::Tensor> all_grads = output_grads(s, mb, state);
    for (size_t i = 0; i < sl.output.size(); ++i) {
      if (all_grads[i].defined() && sl.output[i].requires_grad()) {
        roots.push_back(sl.output[i]);
        grads.push_back(all_grads[i]);
      }
    }
  }
  // The stage's input tensors that take a gradient (none on the first stage: it is data).
  std::vector<torch::Tensor> leaves;
  for (const auto& t : sl.input.tensors()) {
    if (s > 0 && carries_gradient(t) && t.requires_grad()) leaves.push_back(t);
  }
  const bool autograd_split =
      defer_weight_grads && options_.weight_split == ExecutorOptions::WeightSplit::kAutograd;
  if (roots.empty()) {
    // Nothing of this stage's output needs a gradient: no backward to run.
  } else if (autograd_split) {
    // I: the input gradients alone; what W needs of the graph is kept in the weight pass.
    const auto input_grads = input_backward(roots, grads, leaves, sl.weight_pass);
    for (size_t i = 0; i < leaves.size(); ++i) leaves[i].mutable_grad() = input_grads[i];
  } else {
    std::optional<DeferWeightGrads> defer;
    if (defer_weight_grads) defer.emplace(&sl.weight_grads);
    torch::autograd::backward(roots, grads);
  }
  if (s > 0) {
    std::vector<torch::Tensor> input_grads;
    for (const auto& t : sl.input.tensors()) {
      input_grads.push_back(carries_gradient(t) ? t.grad() : torch::Tensor());
    }
    sl.input_grad = gradient_bundle(sl.input, input_grads);
    return_skip_grads(s, mb, state);
    if (is_local(s - 1, mb)) {
      slot(state, s - 1, mb).output_grad = sl.input_grad;
      sl.input_grad = TensorBundle();
    }
  }
  // The graph is freed by backward; drop the ends we held (deferred W closures keep their own).
  sl.forwarded = false;
  sl.input = TensorBundle();
  sl.output = TensorBundle();
  sl.output_grad = TensorBundle();
  if (options_.after_backward) {
    PPTRAIN_ASSERT(!defer_weight_grads, "after_backward needs whole backwards (B), not I and W");
    options_.after_backward(s, mb);
  }
}

void Executor::weight_backward(int s, int mb, StepState& state) {
  Slot& sl = slot(state, s, mb);
  if (sl.weight_pass.empty()) {
    sl.weight_grads.run();  // the deferred layers' closures (none if the stage has no PipeLinear)
    return;
  }
  run_weight_pass(sl.weight_pass, stages_.at(s)->parameters());
}

// Skip connections. One to the very next stage is none: its tensor rides in the ordinary message.
bool Executor::is_skip(const SkipConnection& skip) const {
  return skip.to > skip.from + 1;
}

void Executor::check_skips() const {
  const Schedule& sched = *schedule_;
  if (options_.skips.empty()) return;
  PPTRAIN_ASSERT(segment_ends_.size() == 1, "skip connections on an asynchronous schedule");
  for (const SkipConnection& skip : options_.skips) {
    PPTRAIN_ASSERT(skip.from >= 0 && skip.from < skip.to && skip.to < sched.num_stages,
                   "a skip connection from stage ", skip.from, " to stage ", skip.to, " in ",
                   sched.num_stages, " stages");
  }
  PPTRAIN_ASSERT(skip_links(options_.skips) == sched.skips,
                 "the schedule's skips are not those of ExecutorOptions::skips");
}

TensorBundle Executor::next_stage_part(int s, const TensorBundle& output) const {
  std::vector<std::string> skipping;
  for (const SkipConnection& skip : options_.skips) {
    if (skip.from == s && is_skip(skip)) skipping.push_back(skip.name);
  }
  return skipping.empty() ? output : output.without(skipping);
}

void Executor::send_skips(int s, int mb, const TensorBundle& output, StepState& state) {
  for (const SkipConnection& skip : options_.skips) {
    if (skip.from != s) continue;
    PPTRAIN_CHECK(output.contains(skip.name), "stage ", s, " has a skip connection '", skip.name,
                  "' to stage ", skip.to, ", but its output has no tensor of that name (",
                  output.describe(), ")");
    if (!is_skip(skip)) continue;
    const torch::Tensor tensor = output[skip.name].detach();
    if (is_local(skip.to, mb)) {
      slot(state, skip.to, mb).skip_inputs.add(skip.name, tensor);
    } else {
      slot(state, s, mb).skip_outputs[skip.to].add(skip.name, tensor);  // for its SEND_F
    }
  }
}

void Executor::send_skip_message(const Action& send_action, size_t position, StepState& state) {
  Slot& sl = slot(state, send_action.stage, send_action.microbatch);
  const bool forward = send_action.op == Op::SEND_F;
  auto& waiting = forward ? sl.skip_outputs : sl.skip_input_grads;
  const auto it = waiting.find(send_action.peer);
  PPTRAIN_ASSERT(it != waiting.end(), to_string(send_action), " on rank ", options_.rank,
                 " sends what its ", forward ? "forward" : "backward", " has not produced");
  state.sent[position] = send(position, it->second, state);
  waiting.erase(it);
}

void Executor::take_skips(int s, int mb, StepState& state) {
  Slot& sl = slot(state, s, mb);
  for (const SkipConnection& skip : options_.skips) {
    if (skip.to != s || !is_skip(skip)) continue;
    PPTRAIN_ASSERT(sl.skip_inputs.contains(skip.name), "skip '", skip.name, "' into ", s, "F", mb,
                   " never came from stage ", skip.from);
    PPTRAIN_CHECK(sl.input.named() || sl.input.empty(), "stage ", s, " takes '", skip.name,
                  "' from stage ", skip.from, " through a skip connection, so stage ", s - 1,
                  " must send it a named bundle, not a list (", sl.input.describe(), ")");
    PPTRAIN_CHECK(!sl.input.contains(skip.name), "stage ", s, " takes '", skip.name,
                  "' from stage ", skip.from, " through a skip connection, but stage ", s - 1,
                  " sends one too");
    sl.input.add(skip.name, sl.skip_inputs[skip.name]);
  }
  sl.skip_inputs = TensorBundle();
}

void Executor::return_skip_grads(int s, int mb, StepState& state) {
  Slot& sl = slot(state, s, mb);
  std::vector<std::string> skipping;
  for (const SkipConnection& skip : options_.skips) {
    if (skip.to != s || !is_skip(skip)) continue;
    skipping.push_back(skip.name);
    const torch::Tensor grad =
        sl.input_grad.contains(skip.name) ? sl.input_grad[skip.name] : torch::Tensor();
    if (is_local(skip.from, mb)) {
      slot(state, skip.from, mb).skip_output_grads[skip.name] = grad;
    } else {
      // Sent even when there is none (an int tensor, an unused one): the receiver expects it.
      sl.skip_input_grads[skip.from].add(skip.name, grad);  // for its SEND_B
    }
  }
  if (!skipping.empty()) sl.input_grad = sl.input_grad.without(skipping);  // the rest: to s - 1
}

std::vector<torch::Tensor> Executor::output_grads(int s, int mb, StepState& state) {
  Slot& sl = slot(state, s, mb);
  const std::vector<torch::Tensor> next_grads =
      gradients_for(next_stage_part(s, sl.output), sl.output_grad,
                    "stage " + std::to_string(s + 1) + "'s gradient for the output of stage " +
                        std::to_string(s));
  std::vector<torch::Tensor> out;
  size_t next = 0;
  for (size_t i = 0; i < sl.output.size(); ++i) {
    const auto skip =
        std::find_if(options_.skips.begin(), options_.skips.end(), [&](const SkipConnection& k) {
          return k.from == s && is_skip(k) && k.name == sl.output.label(i);
        });
    if (skip == options_.skips.end()) {
      out.push_back(next_grads.at(next++));
      continue;
    }
    const auto found = sl.skip_output_grads.find(skip->name);
    PPTRAIN_ASSERT(found != sl.skip_output_grads.end(), "the gradient of skip '", skip->name,
                   "' for ", s, "B", mb, " never came from stage ", skip->to);
    const torch::Tensor grad = found->second;
    PPTRAIN_CHECK(!grad.defined() || grad.sizes() == sl.output[i].sizes(), "stage ", skip->to,
                  "'s gradient of skip '", skip->name, "' has shape ", grad.sizes(),
                  ", the tensor ", sl.output[i].sizes());
    out.push_back(carries_gradient(sl.output[i]) ? grad : torch::Tensor());
  }
  sl.skip_output_grads.clear();
  return out;
}

std::vector<StageBytes> measured_stage_bytes(const std::vector<ActionBytes>& bytes, int num_stages,
                                             bool casts_per_step) {
  std::vector<std::vector<double>> forward_kept(num_stages), weight_freed(num_stages);
  std::vector<double> received(num_stages, 0), messages(num_stages, 0);
  std::vector<int> receives(num_stages, 0), message_count(num_stages, 0);
  std::vector<StageBytes> out(num_stages);
  for (const ActionBytes& b : bytes) {
    const int s = b.action.stage;
    PPTRAIN_ASSERT(s >= 0 && s < num_stages, "action bytes of stage ", s, " of ", num_stages);
    StageBytes& stage = out[s];
    double& transient = b.action.op == Op::F ? stage.forward_transient : stage.transient;
    transient = std::max(transient, static_cast<double>(b.transient));
    if (b.action.op == Op::F) forward_kept[s].push_back(static_cast<double>(b.kept));
    if (b.action.op == Op::W) weight_freed[s].push_back(static_cast<double>(-b.kept));
    if (b.action.op == Op::RECV_F) {
      received[s] += static_cast<double>(b.kept);
      ++receives[s];
    }
    if (b.action.op == Op::RECV_F || b.action.op == Op::SEND_F) {
      const int into = comm_peer(b.action).stage;
      const int later = b.action.op == Op::RECV_F ? s : into;
      PPTRAIN_ASSERT(later >= 0 && later < num_stages);
      messages[later] += static_cast<double>(b.kept);
      ++message_count[later];
    }
  }
  for (int s = 0; s < num_stages; ++s) {
    const double input = receives[s] > 0 ? received[s] / receives[s] : 0;
    // A step that casts its weights once does it in each stage's first forward, which keeps
    // them: that forward's excess over the others' is the casts, the others are activations.
    std::vector<double>& kept = forward_kept[s];
    if (casts_per_step && kept.size() > 1) {
      const double first = kept.front();
      kept.erase(kept.begin());
      out[s].weight_casts = std::max(0.0, first - median(kept));
    }
    out[s].activation = median(kept) + input;
    out[s].weight_stash = std::max(0.0, median(weight_freed[s]));
    out[s].message = message_count[s] > 0 ? messages[s] / message_count[s] : 0;
  }
  return out;
}

}  // namespace pptrain
