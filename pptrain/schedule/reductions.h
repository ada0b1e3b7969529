// Data-parallel gradient reduction as schedule actions. With `--dp D` the pipeline runs D
// times side by side and every stage's D replicas all-reduce their weight gradients before the
// optimizer step. add_grad_reductions() puts that all-reduce into the schedule as an action,
// `sREDUCE_GRAD` (action.h), right after the last action of the step that completes stage s's
// weight gradients on its rank, so the all-reduce of an early-finishing stage runs under the
// rest of the cool-down instead of after the flush (torch.distributed.pipelining's REDUCE_GRAD).
//
//   Schedule s = add_grad_reductions(make_schedule({"1f1b", 2, 4}));
//   // rank 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 0REDUCE_GRAD
//   // rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1REDUCE_GRAD
//   simulate(validate(s), cost);   // cost.replicas = D times the reductions (sim/cost_model.h)
//
// Placement: after the rank's last W or B of the stage, also when it is a part of an
// OVERLAP_F_B. In a lowered schedule (with SEND/RECV) the reduction also goes after the SENDs
// that directly follow that action: a neighbour waits for those messages, the reduction waits
// for nobody, and so adding reductions before or after lower() gives the same schedule. Two
// stages whose gradients complete in the same action are reduced in the order of its parts.
//
// Replicated stages (Schedule::placement): the replicas of a stage sum their gradients, so in a
// replicated schedule every rank holding a replica of a stage with two or more replicas gets one
// `sREDUCE_GRAD` ("sum stage s's gradients over replicas_of(s)"), after its own last W or B of s;
// a stage with one replica gets none. Since a reduction ends only when all its replicas have
// reached it, every rank reduces in one global order (stages by the latest of their replicas'
// last W or B), so a rank may hold a reduction back behind an earlier one of the order; the
// validator refuses reductions in opposite orders on two replicas. Chimera, P = 4: ranks 0 and 3
// both reduce stages 0 and 3, ranks 1 and 2 stages 1 and 2.
#pragma once

#include <cstddef>
#include <vector>

#include "pptrain/schedule/schedule.h"

namespace pptrain {

// The schedule with one REDUCE_GRAD per stage, placed as above. Idempotent: the schedule's own
// REDUCE_GRAD actions, if any, are dropped first, so a reduced schedule comes back unchanged.
// UserError for an asynchronous schedule (flushes == false): its optimizer steps inside the run,
// with no step end to reduce at.
Schedule add_grad_reductions(const Schedule& schedule);
// The schedule without its REDUCE_GRAD actions (what one replica alone, D = 1, runs).
Schedule remove_grad_reductions(const Schedule& schedule);
// True if any rank's list holds a REDUCE_GRAD.
bool has_grad_reductions(const Schedule& schedule);

// The schedule as it runs on `copies` copies of the pipeline: the one rule of when a run's
// gradients are combined by REDUCE_GRAD actions, which `pptrain schedule`, `plan`, `train`,
// `compare` and the library's PipelineSchedule all apply. A replicated schedule that places
// none of its own gets its replicas' sums; with copies > 1 every stage gets the copies'
// all-reduce, unless the schedule averages its copies itself (`averages_copies`: avgpipe's
// elastic averaging); any other schedule comes back unchanged.
Schedule with_grad_reductions(Schedule schedule, int copies = 1, bool averages_copies = false);

// A replicated schedule's reductions as collectives: `queues[r]` lists the stages rank r reduces,
// in its list order, and the reduction of a stage ends once every replica of it (replicas_of) has
// reached its own, each replica taking its reductions one after another. Returns the stages in
// an order in which their reductions can end, each once; `head[r]` comes back as the number of
// rank r's reductions that ended, fewer than queues[r].size() where its next one can never end
// (two replicas reducing two stages in opposite orders). The validator refuses that; the
// simulator times the reductions in the returned order.
std::vector<int> match_replica_reductions(const Schedule& schedule,
                                          const std::vector<std::vector<int>>& queues,
                                          std::vector<size_t>& head);

}  // namespace pptrain
