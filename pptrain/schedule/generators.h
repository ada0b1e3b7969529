// Schedule generators: GPipe, 1F1B, interleaved 1F1B and the zero-bubble family.
//
// Each generator writes a compute-only Schedule (F, B or F, I, W; no SEND/RECV: call lower() to
// add communication). The result is a fixed per-rank order; the simulator times it under any
// cost model, the runtime executes it.
//
//   Schedule s = make_schedule({.name = "1f1b", .ranks = 4, .microbatches = 8});
//   Schedule z = make_schedule(ScheduleOptions{"zb-v", 4, 8});   // chunks = 2 by default
//
// Notation below: P ranks, M microbatches, V chunks (stages per rank), and F, I, W the times of
// one rank's whole share of the model for one microbatch (B = I + W). "Bubble" is the idle time
// of a rank between its first and its last action when every stage costs the same and
// communication is free; "peak activations" counts microbatches' worth of one rank's share held
// at once (one chunk's stash counts 1/V), from a stage's F until its I or B.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/schedule.h"

namespace pptrain {

struct ScheduleOptions {
  std::string name;      // one of schedule_names(): "gpipe", "1f1b", "interleaved-1f1b", ...
  int ranks = 1;         // P >= 1
  int microbatches = 1;  // M >= 1
  int chunks = 0;        // V: stages per rank; 0 = the schedule's default (2 for
                         // interleaved-1f1b and zb-v, 1 otherwise)
};

// Builds the named schedule. Throws UserError naming the bad value for an unknown name or
// impossible parameters (P < 1, M < 1, a V the schedule does not support, M not a multiple of P
// for interleaved-1f1b).
Schedule make_schedule(const ScheduleOptions& options);

// The names make_schedule() accepts, in a stable order.
const std::vector<std::string>& schedule_names();

// The generators themselves (make_schedule() checks the options and dispatches to one of these).

// GPipe: every rank runs all M forwards, then all M backwards (in reverse microbatch order).
// Bubble (P-1)(F+B); peak activations M on every rank.
Schedule make_gpipe(int ranks, int microbatches);

// 1F1B (PipeDream-Flush / DAPPLE): rank r runs min(P-1-r, M) warm-up forwards, then alternates
// one forward and one backward, then drains the remaining backwards.
// Bubble (P-1)(F+B), as GPipe; peak activations min(P-r, M) on rank r.
Schedule make_1f1b(int ranks, int microbatches);

// Interleaved 1F1B (Megatron-LM virtual stages): V chunks per rank, stage s on rank s % P.
// Microbatches go through in groups of P per chunk, so M must be a multiple of P (V >= 2).
// Bubble (P-1)(F+B)/V; peak activations on rank r: min(M*V, (V-1)P + 2(P-1-r) + 1) / V
// (chunk stashes of 1/V each), e.g. P(1 + 1/V) - 1/V on rank 0.
Schedule make_interleaved_1f1b(int ranks, int microbatches, int chunks);

// ZB-H1 (zero-bubble paper, "handcrafted 1"): 1F1B with backward split into I and W; rank r
// defers up to P-1-r of its W's to fill the cool-down. Same memory as 1F1B: peak min(P-r, M).
// Bubble (P-1)(F+I-W) when M >= P (and F+I >= W).
Schedule make_zb_h1(int ranks, int microbatches);

// ZB-H2 ("handcrafted 2"): rank r runs up to 2(P-1-r) + 1 warm-up forwards so the warm-up
// bubble fills with forwards and the cool-down with deferred W's (run in any microbatch order).
// Peak activations at most min(2P-2r-1, M); bubble (P-1)(F+I-2W) when M >= 2P-1 (and F+I >= 2W).
Schedule make_zb_h2(int ranks, int microbatches);

// ZB-V: V = 2, rank r holds stages r and 2P-1-r (a V: the last stage is back on rank 0).
// Built by a greedy list scheduler driven by unit costs, with at most 2P chunk stashes (of 1/2
// each) live per rank. Zero bubble for F = I = W when M >= 2P; peak activations at most
// min(P, M) on every rank: 1F1B's peak on its first rank.
Schedule make_zb_v(int ranks, int microbatches);

}  // namespace pptrain
