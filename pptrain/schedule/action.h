// One step of a pipeline schedule, and its text form.
//
// The text form is the one torch.distributed.pipelining writes, so schedules can be exchanged
// with it: `<stage><op><microbatch>`, e.g. `0F1` (stage 0, forward of microbatch 1), `3I0`,
// `2W5`, `1B2`, `0SEND_F3`, `1RECV_B0`; a composite is `(0F7;7B3)OVERLAP_F_B`. A reduction over
// the data-parallel replicas has no microbatch: `0REDUCE_GRAD` (stage 0; microbatch -1).
//
//   Action a = parse_action("2W5");   // {Op::W, stage 2, microbatch 5}
//   to_string(a) == "2W5";
//
// An action is 16 bytes (a schedule of P = 256 ranks and thousands of microbatches holds millions
// of them). A composite's parts live in a table of the process, shared by every equal composite
// (Action::overlap interns them, Action::parts reads them); the action holds their index.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pptrain {

enum class Op : std::uint8_t {
  F,            // forward of one stage for one microbatch
  I,            // backward for the stage's input (the zero-bubble paper's B)
  W,            // backward for the stage's weights
  B,            // full backward: I and W fused
  SEND_F,       // stage sends its forward output to stage + 1 (a skip message: to `peer`)
  RECV_F,       // stage receives its forward input from stage - 1 (a skip message: from `peer`)
  SEND_B,       // stage sends the gradient of its input to stage - 1 (skip: to `peer`)
  RECV_B,       // stage receives the gradient of its output from stage + 1 (skip: from `peer`)
  OVERLAP_F_B,  // composite: a forward and a backward run together (see Action::parts())
  REDUCE_GRAD,  // all-reduce the stage's weight gradients of the whole step over its
                // data-parallel replicas (--dp); microbatch -1 (schedule/reductions.h)
};

struct Action {
  Op op = Op::F;
  int stage = 0;       // global stage index, 0 .. num_stages-1 (-1 for a composite)
  int microbatch = 0;  // 0 .. num_microbatches-1 (-1 for a composite or REDUCE_GRAD)
  // A SEND or RECV of a skip message: the stage at the other end. An OVERLAP_F_B: the index of
  // its parts in the process's table of composites (see parts()). Else -1.
  int peer = -1;

  Action() = default;
  // Also what `list.emplace_back(op, stage, microbatch)` calls, which writes the action in place:
  // push_back of a returned Action stores it in two halves and reads it back whole, a load the
  // processor cannot forward from the stores (a stall per action in the generators' loops).
  constexpr Action(Op op, int stage, int microbatch, int peer = -1)
      : op(op), stage(stage), microbatch(microbatch), peer(peer) {}

  static Action make(Op op, int stage, int microbatch) { return Action{op, stage, microbatch}; }
  // A SEND or RECV of the skip message between `stage` and `peer` (not adjacent stages).
  static Action skip(Op op, int stage, int microbatch, int peer) {
    return Action{op, stage, microbatch, peer};
  }
  // An OVERLAP_F_B of `parts` (plain actions, in order). Equal parts give equal composites.
  // Safe to call from several threads.
  static Action overlap(const std::vector<Action>& parts);
  // A composite's parts, in order (they live as long as the process); empty for any other action.
  const std::vector<Action>& parts() const;

  bool operator==(const Action& other) const {
    return op == other.op && stage == other.stage && microbatch == other.microbatch &&
           peer == other.peer;
  }
  bool operator!=(const Action& other) const { return !(*this == other); }
};
static_assert(sizeof(Action) == 16, "an action is 16 bytes (see above)");

// Short op name as it appears in the text form: "F", "I", "SEND_F", ...
const char* op_name(Op op);
// (Inline: every pass over a schedule asks them for every action.)
inline bool is_compute(Op op) {  // F, I, W, B, OVERLAP_F_B
  return op == Op::F || op == Op::I || op == Op::W || op == Op::B || op == Op::OVERLAP_F_B;
}
inline bool is_comm(Op op) {  // SEND_F, RECV_F, SEND_B, RECV_B: point-to-point, one message each
  return op == Op::SEND_F || op == Op::RECV_F || op == Op::SEND_B || op == Op::RECV_B;
}
inline bool is_collective(Op op) {  // REDUCE_GRAD: neither compute nor a message between stages
  return op == Op::REDUCE_GRAD;
}
inline bool is_backward(Op op) {  // I or B: the action that consumes a stage's activations
  return op == Op::I || op == Op::B;
}
inline bool is_send(Op op) {  // SEND_F, SEND_B
  return op == Op::SEND_F || op == Op::SEND_B;
}
inline bool is_recv(Op op) {  // RECV_F, RECV_B
  return op == Op::RECV_F || op == Op::RECV_B;
}
inline bool is_skip_message(const Action& action) {
  return action.peer >= 0 && is_comm(action.op);
}

std::string to_string(const Action& action);
// Parses the text form. Throws UserError naming the text if it is not an action.
Action parse_action(std::string_view text);

// The plain actions inside an action: the parts of an OVERLAP_F_B, else the action itself. A
// view into the action, which must outlive it.
class Atoms {
 public:
  explicit Atoms(const Action& action) : first_(&action), last_(&action + 1) {
    if (action.op != Op::OVERLAP_F_B) return;
    const std::vector<Action>& parts = action.parts();  // one look in the table of composites
    first_ = parts.data();
    last_ = parts.data() + parts.size();
  }
  const Action* begin() const { return first_; }
  const Action* end() const { return last_; }
  bool empty() const { return first_ == last_; }

 private:
  const Action* first_;
  const Action* last_;
};
inline Atoms atoms_of(const Action& action) {
  return Atoms(action);
}

}  // namespace pptrain
