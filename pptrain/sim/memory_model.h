// The memory model: each rank's peak bytes of a schedule, split into parts. A run prints it
// beside the peak it measured (`predicted_peak_memory_bytes`, api/pipeline.h; its inputs read
// off the step: runtime/executor.h, measured_stage_bytes), and `pptrain plan` ranks candidates
// by it (planner.h; its inputs from the profile).
//
//   std::vector<StageBytes> stages(lowered->num_stages);   // e.g. measured
//   stages[0].weights = 4e6;
//   stages[0].optimizer_state = 8e6;
//   stages[0].activation = 1e6;
//   std::vector<RankMemory> ranks = predict_memory(lowered, stages, VersionRule{});
//   ranks[0].total();
//
// The model's inputs are bytes of each stage (StageBytes); a rank's peak is made of
//   weights      sum over its stages s of weights(s), and when an asynchronous rule keeps more
//                than one version of s (schedule/weight_versions.h: versions_kept) a snapshot of
//                each beside the live weights (runtime/stage_versions.h), all held all the time,
//                as in the rule's steady state
//   casts        sum of weight_casts(s): the copies of the weights in the compute dtype that a
//                step casting them once (--weight-casts step) holds from its first forward to
//                its end, through its activations' peak
//   gradients    one .grad per copy of the weights, and one more for the flat buffer in which a
//                stage's copies (--dp, or a replicated schedule's replicas) all-reduce them
//                (MemoryRules::gradient_buffers)
//   optimizer    sum of optimizer_state(s) (AdamW two moments per parameter, SGD with momentum
//                one; under ZeRO-1 of the layers the rank keeps)
//   data         the step's batch its stages read, sum of data(s) (the first stage's inputs,
//                the last one's targets), held through the step
//   activations  the most the rank's own order of actions holds at once when a microbatch's F
//                adds activation(s), its I frees all but weight_stash(s), its W frees that and
//                a fused B all of it (the simulator's peak_activations, simulator.h)
//   messages     what the messages in flight add to that peak: each receive's buffer from when
//                the runtime posts it (MemoryRules::recv_ahead ahead, schedule/semantics.h:
//                receives_posted) until its F takes it as input (counted in activation(s)
//                from then) or its I or B has used the gradient; each send's packed copy until
//                the runtime lets it go (send_releases). A message into stage s or its gradient
//                back has message(s) bytes; skip connections' messages are not counted
//   transient    what an action's own working memory (StageBytes::transient of a backward,
//                forward_transient of a forward) adds to the most the rank holds: taken where
//                it runs, after a forward's activation was added and before a backward frees its
//                own, on top of the activations and messages held then
// and total() is their sum. A fresh optimizer has no state during the first step's backwards:
// its state is made by the update, when the activations are gone, so with fresh_state total()
// counts the larger of the optimizer and the step's activations, messages and transient.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/schedule/weight_versions.h"

namespace pptrain {

// Bytes of one stage (any unit, bytes in pptrain's uses).
struct StageBytes {
  double weights = 0;          // one version of its parameters
  double optimizer_state = 0;  // what its optimizer keeps on this rank
  double activation = 0;       // one microbatch's, from its F to its I or B (stage input included)
  double weight_stash = 0;     // what one microbatch's W still needs after its I
  // The most one action of the stage holds above both its ends: a backward (I, B or W, e.g. a
  // recomputed forward's graph, the gradients it makes on the way), and a forward.
  double transient = 0;
  double forward_transient = 0;
  double message = 0;  // one microbatch's message into it from stage s - 1 (0: none)
  double data = 0;     // the step's inputs and targets it reads from the batch (all microbatches)
  double weight_casts = 0;  // its weights cast for the whole step (ExecutorOptions::casts_per_step)
};

// How the runtime holds gradients and messages (runtime/executor.h).
struct MemoryRules {
  bool gradient_buffers = false;  // a flat buffer of each stage's gradients (its copies sum them)
  int recv_ahead = 4;             // ExecutorOptions::recv_ahead
  // Whether a posted receive holds its message's bytes: it is sized as its tag's last message
  // (runtime/tensor_bundle.h), so not in a run's first step, where it holds a notice only until
  // its message comes.
  bool sized_receives = true;
  // Without sized receives: the notice a posted receive holds until its message comes, and that
  // its sender sends (and holds) beside each message (runtime/tensor_bundle.h: kNoticeBytes).
  double notice_bytes = 0;
};

struct RankMemory {
  double weights = 0;
  double casts = 0;
  double gradients = 0;
  double optimizer = 0;
  double data = 0;
  double activations = 0;
  double messages = 0;
  double transient = 0;
  // The first step of a fresh optimizer: its state is made by the update, after the backwards
  // (set by the caller; predict_memory leaves it false).
  bool fresh_state = false;
  double total() const {
    const double step = casts + activations + messages + transient;
    return weights + gradients + data +
           (fresh_state ? std::max(step, optimizer) : step + optimizer);
  }
};

// The schedule's part of the model, made once for a validated schedule and a number of receives
// posted ahead: each rank's lowered list (with its SEND and RECV actions, as the runtime runs it;
// a compute-only schedule is lowered for the walk) as the events of the runtime's rules (when a
// receive is posted and its message comes, when a send is let go, which buffer a compute action
// takes), so that predicting for other stage bytes (each step of a run, each candidate of the
// planner) is one pass over them.
class MemoryWalk {
 public:
  struct Event {
    enum Kind : unsigned char {
      kPost,
      kArrive,
      kSend,
      kRelease,
      kNote,
      kForward,
      kInput,
      kBackward,
      kWeight
    };
    // 8 bytes, a walk holds a few per action: kind, whether the rank's peak is taken (noted)
    // right before this event (the point between an action's posted receives and the rest of
    // it; kNote stands alone where an action has no event of its own), stage and slot.
    Event(Kind kind, bool noted, int stage, int slot)
        : kind(kind), noted(noted ? 1 : 0), stage(stage), slot(slot) {}
    Kind kind : 4;
    unsigned noted : 1;
    int stage : 27;  // whose bytes: a message's (-1: a skip message), a compute action's
    int slot;        // the message's place on its rank (-1: none)
  };
  explicit MemoryWalk(const ValidatedSchedule& validated,
                      int recv_ahead = MemoryRules{}.recv_ahead);
  const std::string& name() const { return name_; }
  int num_ranks() const { return static_cast<int>(events_.size()); }
  int num_stages() const { return num_stages_; }
  int recv_ahead() const { return recv_ahead_; }
  const std::vector<Event>& events(int rank) const { return events_[rank]; }
  const std::vector<int>& stages_of(int rank) const { return stages_of_[rank]; }
  size_t slots() const { return slots_; }  // the most message places of a rank

 private:
  std::string name_;
  int num_stages_ = 0;
  int recv_ahead_ = 0;
  size_t slots_ = 0;
  std::vector<std::vector<Event>> events_;
  std::vector<std::vector<int>> stages_of_;
};

// One RankMemory per rank of the walk's schedule; `stages` has one entry per stage. UserError
// when `stages` has another size than the schedule's stages, or the rule is for another number
// of stages; `rules.recv_ahead` must be the walk's.
std::vector<RankMemory> predict_memory(const MemoryWalk& walk,
                                       const std::vector<StageBytes>& stages,
                                       const VersionRule& rule = VersionRule{},
                                       const MemoryRules& rules = MemoryRules{});
// The same for `lowered` (a validated schedule with its SEND and RECV actions), its walk made
// for this call.
std::vector<RankMemory> predict_memory(const ValidatedSchedule& lowered,
                                       const std::vector<StageBytes>& stages,
                                       const VersionRule& rule = VersionRule{},
                                       const MemoryRules& rules = MemoryRules{});

// A table of the ranks' predicted parts in MiB, one line per rank, and with `measured` (bytes,
// one per rank) the measured peak beside the total and their difference in percent.
std::string format_memory(const std::vector<RankMemory>& predicted,
                          const std::vector<double>& measured = {});
// [{"weights", "gradients", "optimizer", "data", "activations", "messages", "transient",
// "total"} per rank] in bytes,
// with "measured" when given.
nlohmann::ordered_json memory_json(const std::vector<RankMemory>& predicted,
                                   const std::vector<double>& measured = {});

}  // namespace pptrain
