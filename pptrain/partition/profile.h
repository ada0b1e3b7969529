// Per-layer costs of a model, the input of every partitioner.
//
// A Profile is a chain: layer i feeds layer i+1, and a pipeline may be cut after any layer. Two
// sources are read:
//   - our JSON ("format": "pptrain-profile-1", written by `pptrain profile`), already a chain;
//   - PipeDream's profiler output (graph.txt), a DAG of nodes. Branchy graphs (ResNet's skip
//     connections, GNMT) are reduced to a chain the way PipeDream's optimizer sees them: the
//     nodes in one topological order, so every prefix is a legal cut (a set closed under
//     predecessors); the bytes of a cut are those of every tensor that crosses it.
//
//   Profile p = read_profile("data/pipedream/vgg16/graph.txt");   // or a .json profile
//   for (const LayerProfile& l : p.layers) total_ms += l.forward_ms + l.backward_ms();
//
// Bad input (missing field, negative time, cycle, edge to an unknown node, no layers) throws
// UserError naming the source, the line or layer and the field.
#pragma once

#include <string>
#include <vector>

#include "pptrain/common/precision.h"

namespace pptrain {

struct LayerProfile {
  std::string name;
  double forward_ms = 0;          // forward time of one microbatch
  double backward_input_ms = 0;   // backward for the input gradient (I); the whole B if unsplit
  double backward_weight_ms = 0;  // backward for the weight gradients (W)
  // Bytes sent to the next stage if the pipeline is cut right after this layer (the gradient
  // coming back has the same size). For a plain chain that is the layer's output; for a reduced
  // DAG it is every tensor crossing the cut. Unused for the last layer.
  double activation_bytes = 0;
  double stash_bytes = 0;      // bytes kept from forward until backward, per microbatch
  double parameter_bytes = 0;  // weights
  // Of stash_bytes, what the deferred weight gradients still hold after I, until W (the weight
  // layers' inputs and output gradients); < 0: not measured (a profile of an older pptrain,
  // PipeDream's), and the planner takes --mem-w-ratio of stash_bytes instead.
  double weight_stash_bytes = -1;
  // The most one microbatch's forward and backward (I and W) hold above what they start and end
  // with (the graph's intermediates, the gradients on the way); < 0: not measured (taken as 0).
  double forward_transient_bytes = -1;
  double backward_transient_bytes = -1;
  // Of stash_bytes, forward_transient_bytes and backward_transient_bytes, the part that does not
  // grow with the microbatch's samples (a mask made once per forward; at bf16, the weights cast
  // for the forward's products): kept as it is when the planner scales the profile to another
  // microbatch size, where the rest scales with the samples. 0: all of it grows (a profile
  // measured at one sample, of an older pptrain, PipeDream's).
  double stash_fixed_bytes = 0;
  double forward_transient_fixed_bytes = 0;
  double backward_transient_fixed_bytes = 0;

  double backward_ms() const { return backward_input_ms + backward_weight_ms; }
  double compute_ms() const { return forward_ms + backward_ms(); }
};

// How fast this machine sums gradients over data-parallel copies: a ring all-reduce of N bytes
// over r ranks takes latency_ms + 2(r-1)/r x N / bandwidth (sim/cost_model.h). Measured by
// `pptrain profile` (Gloo over TCP on this host); zeros: not measured.
struct NetworkProfile {
  int ranks = 0;                     // ranks it was measured with
  double bandwidth_bytes_per_s = 0;  // 0: not measured
  double latency_ms = 0;
  bool measured() const { return bandwidth_bytes_per_s > 0; }
};

// What the runtime spends on an action beyond the action's own work, on this machine, in ms:
// the overheads of sim/cost_model.h (CostModel::action_overhead, send_overhead, recv_overhead).
// Measured by `pptrain profile` (runtime/overhead_probe.h); zeros: not measured (a profile of an
// older pptrain, PipeDream's), and the simulator counts them as free.
struct OverheadProfile {
  double action_ms = 0;  // after each compute action: the executor's bookkeeping
  double send_ms = 0;    // a SEND: packing the message and posting it
  double recv_ms = 0;    // a RECV of a message that has arrived: taking it, unpacking
  bool measured() const { return action_ms > 0 || send_ms > 0 || recv_ms > 0; }
};

struct Profile {
  std::vector<LayerProfile> layers;
  NetworkProfile network;     // optional "network" object of our JSON
  OverheadProfile overheads;  // optional "overheads" object of our JSON
  // Samples in the microbatch the figures were measured on ("settings": {"microbatch_size"} of
  // our JSON); 0: not recorded (PipeDream's graph.txt).
  int microbatch_size = 0;
  // Bytes of one profiled microbatch's inputs (read by the first layer) and targets (by the
  // loss after the last) ("batch" object of our JSON); 0: not recorded.
  double input_bytes = 0;
  double target_bytes = 0;
  // What the layers computed in ("settings": {"precision"}); fp32 when the profile says none.
  Precision precision = Precision::kFp32;
  std::string source;  // where it came from (a path, or "<string>"), for messages

  // Whether any layer gives a W time apart from its I: a profile with one backward time per
  // layer (PipeDream's graph.txt) does not, and its backward_input_ms is the whole B.
  bool splits_backward() const;
};

// `profile` as a run at `precision` would have measured its bytes: the activations, messages,
// stashes and transients scaled by the ratio of the two precisions' element bytes (exact for a
// message of floating-point tensors, close for a stash that also keeps integer ids or float32
// statistics); parameters (float32 master weights at every precision), the batch and the times
// as measured. Itself when the precisions are the same.
Profile at_precision(Profile profile, Precision precision);

// Reads a file, choosing the format by its content: JSON if the first non-blank character is
// '{', PipeDream graph.txt otherwise.
Profile read_profile(const std::string& path);

// Our JSON. Every layer needs name, forward_ms, backward_input_ms, backward_weight_ms,
// activation_bytes, stash_bytes and parameter_bytes, all >= 0; weight_stash_bytes,
// forward_transient_bytes and backward_transient_bytes (>= 0) are optional, so are
// stash_fixed_bytes, forward_transient_fixed_bytes and backward_transient_fixed_bytes (>= 0, at
// most the field they are part of), and so are the "batch"
// object {"input_bytes", "target_bytes"}, the "network" object and the "overheads" object
// {"action_ms", "send_ms", "recv_ms"} (each a number >= 0).
Profile parse_profile_json(const std::string& text, const std::string& source = "<string>");

// PipeDream graph.txt. Node lines
//   nodeN -- Description -- forward_compute_time=ms, backward_compute_time=ms,
//            activation_size=bytes, parameter_size=bytes
// and edge lines "\tnodeA -- nodeB". As PipeDream's optimizer does, "Input*" sources and unused
// "__getitem__" sinks are dropped. Mapping: backward_compute_time -> backward_input_ms
// (PipeDream does not split backward, so backward_weight_ms = 0); activation_size -> stash_bytes
// (a list "[a; b]" is summed); the bytes crossing each cut -> activation_bytes.
Profile parse_pipedream_graph(const std::string& text, const std::string& source = "<string>");

}  // namespace pptrain
