// Rank agreement: every rank of a run must have made the same plan.
//
// Ranks started by hand (torchrun style) each parse their own flags. Before this check, a rank
// with another --d-model aborted inside Gloo, another --seed trained silently wrong and another
// --schedule hung until the communication timeout. Now, before any pipeline message, every rank
// sends rank 0 the settings that must agree (plan_settings), rank 0 compares them with its own
// and tells every rank the verdict, and on a mismatch every rank stops with the same one-line
// UserError (exit status 2) naming the flag and the ranks:
//
//   ranks disagree on --d-model: rank 0 has 64, rank 1 has 128 (start every rank with the same
//   flags)
//
//   check_ranks_agree(plan, transport);   // collective: every rank calls it, once
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "pptrain/runtime/transport.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// (flag, value) pairs that must be equal on every rank: the model, the data and its seed, the
// batch and its microbatches, the world, the schedule (its name and a digest of its actions),
// the stage layers, the optimizer and the step count.
std::vector<std::pair<std::string, std::string>> plan_settings(const TrainingPlan& plan);

// Collective over all ranks; UserError on every rank if any rank's settings differ from rank
// 0's. A no-op for a single rank.
void check_ranks_agree(const TrainingPlan& plan, Transport& transport);

}  // namespace pptrain
