// A pipeline schedule as plain data: which ranks run which stages, and each rank's ordered list
// of actions. Generators write it, lowering adds communication, the validator checks it, the
// simulator and the runtime both read it.
//
// Virtual stages are simply more stages than ranks: interleaved 1F1B is stage s on rank s % P,
// ZB-V is stages r and 2P-1-r on rank r. Nothing else in the schedule knows about them.
//
// Replicated stages: a stage may run on several ranks (its replicas), each microbatch on one of
// them. `placement` then says where every (stage, microbatch) runs; Chimera and GEMS hold two
// replicas of every stage (stage s on ranks s and P-1-s), 1F1B-RR routes microbatch i to replica
// i mod r_s of stage s. `stage_to_rank` keeps the stage's first replica (its lowest rank) so that
// code written for one rank per stage still finds a rank, but whatever needs the rank a
// (stage, microbatch) really runs on must ask rank_of(); stages_of() lists every replica.
//
// Skip connections: a model may send part of stage `from`'s output straight to stage `to`, more
// than one stage later (a U-Net's encoder to its decoder), and take the gradient back the same
// way. `skips` lists those pairs; lowering then adds one message each way per microbatch whose
// two stages run on different ranks (SEND/RECV actions with Action::peer set), which the
// validator, the simulator and the runtime treat like any other message. On one rank the tensor
// is handed over. A skip to the very next stage is no skip: it rides in the ordinary message.
//
// CSV form (as torch.distributed.pipelining writes it): one row per rank, one action per cell,
// empty cells allowed (an idle step; it carries no meaning and is dropped on import).
//
//   Schedule s = read_schedule_csv("1f1b.csv");   // infers P, stages, M and placement
//   write_schedule_csv(s, "copy.csv");
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "pptrain/schedule/action.h"

namespace pptrain {

// Stage `from`'s output reaches stage `to` (from + 1 < to) directly (see above).
struct SkipLink {
  int from = 0;
  int to = 0;
  bool operator==(const SkipLink& other) const { return from == other.from && to == other.to; }
  bool operator<(const SkipLink& other) const {
    return from != other.from ? from < other.from : to < other.to;
  }
};

struct Schedule {
  std::string name;                          // e.g. "1f1b"; "imported" for a file
  int num_ranks = 0;                         // P: worker processes in the pipeline
  int num_stages = 0;                        // P * V: consecutive pieces of the model
  int num_microbatches = 0;                  // M: microbatches per mini-batch
  std::vector<int> stage_to_rank;            // [num_stages] -> rank that runs the stage (for a
                                             // replicated schedule: its lowest replica)
  std::vector<std::vector<Action>> actions;  // [num_ranks] -> actions in execution order
  bool flushes = true;  // true: synchronous (all microbatches drain before the optimizer step)
  // Optional: [num_stages][num_microbatches] -> the rank that runs that stage for that
  // microbatch (its F, I, W, B and the SEND/RECV of its messages). Empty: stage_to_rank.
  std::vector<std::vector<int>> placement;
  // Optional: the skip connections' stage pairs, sorted and distinct (see above).
  std::vector<SkipLink> skips;

  // V: the stages a rank runs for one microbatch, num_stages / num_ranks; with replicas, the
  // stages over the ranks a microbatch passes (Chimera and 1f1b-rr 1, BitPipe 2).
  int chunks() const;
  // How many shares of the model a rank's time and memory are counted in (sim/cost_model.h):
  // the stages over the chunks, P without replicas.
  int shares() const { return chunks() ? num_stages / chunks() : 0; }
  // True if `placement` is set (a stage may then have several replicas).
  bool replicated() const { return !placement.empty(); }
  // The rank that runs `stage` for `microbatch` (0 .. M-1): placement[stage][microbatch], or
  // stage_to_rank[stage] when there is no placement.
  int rank_of(int stage, int microbatch) const {
    return placement.empty() ? stage_to_rank[stage] : placement[stage][microbatch];
  }
  // The ranks holding `stage`, ascending: {stage_to_rank[stage]} without a placement.
  std::vector<int> replicas_of(int stage) const;
  // Stages held by a rank (in any of their replicas), in increasing order.
  std::vector<int> stages_of(int rank) const;
  // The index in `skips` of the link between stages a and b (either order); -1 if none.
  int skip_index(int a, int b) const;
  // True if any rank's list holds a SEND or RECV action.
  bool has_comms() const;
  // True if the schedule splits backward into I and W anywhere.
  bool has_split_backward() const;
  bool operator==(const Schedule& other) const;
};

// The same schedule with every rank's list empty (everything else copied): for whoever writes new
// lists for it without copying the old ones first.
Schedule without_actions(const Schedule& schedule);
// The same schedule with every SEND/RECV action removed.
Schedule strip_comms(const Schedule& schedule);

// CSV text of the schedule (one row per rank). Composite actions keep their ';' inside one cell.
std::string to_csv(const Schedule& schedule);
// Parses CSV text. Infers P (rows), the number of stages and microbatches (largest index + 1),
// stage_to_rank (the rank whose row holds the stage's actions) and the skips (from the skip
// messages' actions). torch's `<stage>UNSHARD` and `<stage>RESHARD` cells (FSDP's all-gather
// and release of a stage's parameters) are dropped, as empty cells are. A stage whose actions are
// on several rows is replicated: the placement is read from the row of each (stage, microbatch),
// stage_to_rank is its lowest row. Throws UserError naming the row and cell for a bad action, a
// (stage, microbatch) that appears on two ranks, or a REDUCE_GRAD on a rank without its stage.
Schedule parse_csv(const std::string& text, const std::string& name = "imported");
Schedule read_schedule_csv(const std::string& path);
void write_schedule_csv(const Schedule& schedule, const std::string& path);

}  // namespace pptrain
