// Schedule generators: GPipe, 1F1B, interleaved 1F1B, the zero-bubble family, and the schedules
// with replicated stages (Chimera, GEMS, 1F1B-RR).
//
// Each generator writes a compute-only Schedule (F, B or F, I, W; no SEND/RECV: call lower() to
// add communication). The result is a fixed per-rank order; the simulator times it under any
// cost model, the runtime executes it.
//
//   Schedule s = make_1f1b(/*ranks=*/4, /*microbatches=*/8);
//   Schedule z = make_zb_v(4, 8);   // by name: make_schedule({"zb-v", 4, 8}) (registry.h)
//
// Notation below: P ranks, M microbatches, V chunks (stages per rank), and F, I, W the times of
// one rank's whole share of the model for one microbatch (B = I + W). A rank's "bubble" is
// cost - busy, cost being the longest first-start-to-last-end span of any rank (the definitions
// of pptrain/sim/metrics.h), with equal stages and free communication. "Peak activations" counts
// microbatches' worth of one rank's share held at once (a chunk's stash counts 1/V), from a
// stage's F until its I or B: the simulator's figure with --mem-w-ratio 0. Its default memory
// model (sim/cost_model.h) also keeps r = 0.5 of each microbatch from I until W, which adds r per
// held-back W: with r = 0.5 ZB-H1 peaks at P - k/2 on rank k and ZB-H2 at 2P - 1 - k. zb-auto
// (auto_schedule.h) plans under a limit in that model.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/schedule.h"

namespace pptrain {

// The generators; make_schedule() (registry.h) resolves a name and the chunks, then calls one.
// Each checks its own parameters (P >= 1, M >= 1, ...) and throws UserError naming the bad value.

// GPipe: every rank runs all M forwards, then all M backwards, both in microbatch order.
// Bubble (P-1)(F+B) per rank, i.e. bubble ratio (P-1)/(M+P-1); peak activations M on every rank.
Schedule make_gpipe(int ranks, int microbatches);

// 1F1B (PipeDream-Flush / DAPPLE): rank r runs min(P-1-r, M) warm-up forwards, then alternates
// one forward and one backward, then drains the remaining backwards.
// Bubble (P-1)(F+B), as GPipe's; peak activations min(P-r, M) on rank r.
Schedule make_1f1b(int ranks, int microbatches);

// Interleaved 1F1B (Megatron-LM virtual stages): V >= 2 chunks per rank, stage s on rank s % P.
// Microbatches go through in groups of P per chunk, so M must be a multiple of P. Rank r warms
// up with min(MV, (V-1)P + 2(P-1-r)) chunk forwards, then alternates, then drains.
// Bubble (P-1)(F+B)/V per rank (1/V of 1F1B's); peak activations
// min(MV, (V-1)P + 2(P-1-r) + 1) / V on rank r, e.g. ((V+1)P - 1)/V on rank 0 when M >= 2P.
Schedule make_interleaved_1f1b(int ranks, int microbatches, int chunks);

// ZB-H1 (zero-bubble paper, handcrafted schedule 1): 1F1B's frame with the backward split into
// I and W. Rank r warms up with P-1-r forwards like 1F1B, then runs F, I pairs; a W follows as
// soon as more than r W's are waiting (rank 0 runs each W right after its I, the last rank holds
// back P-1), and the held-back W's fill the tail where 1F1B would idle.
// Peak activations min(P-r, M), as 1F1B's. Bubble (P-1)(F+I-W) per rank when M >= P and W <= F.
Schedule make_zb_h1(int ranks, int microbatches);

// 1F1B's order with each backward split into an I and its W right after it: what a zero-bubble
// schedule falls back to under 1F1B's memory (zb-auto's candidate, not a registry entry; the
// runtime runs I, W as it runs B). Peak activations min(P-r, M) on rank r, as 1F1B's.
Schedule make_1f1b_split(int ranks, int microbatches);

// ZB-H2 (handcrafted schedule 2): as ZB-H1 with 2(P-1-r) warm-up forwards and 2r held-back W's,
// so the warm-up's idle time is spent on forwards. W's stay in microbatch order.
// Peak activations min(2P-2r-1, M) on rank r. Bubble (P-1)(F+I-2W) per rank when M >= 2P-1,
// W <= F and 2W <= F+I (zero for F = I = W). No optimizer-step bypass: the schedule still
// flushes, so this is the paper's ZB-H2 order without its post-validation trick.
Schedule make_zb_h2(int ranks, int microbatches);

// ZB-V: V = 2, rank r holds stages r and 2P-1-r (a V: the last stage is back on rank 0).
// Built by a greedy list scheduler with unit costs (see generators.cpp for the rule), holding at
// most 2P chunk stashes (P microbatches of the rank's share) and at most 2P waiting W's per rank.
// Bubble 0 for F = I = W when M >= 2P (in fact from M = 2P-1); peak activations at most min(P, M)
// on every rank, 1F1B's peak on its first rank. With unequal F, I, W the fixed order leaves a
// bubble that does not grow with M and is below 1F1B's (checked in pptrain/sim/simulator_test).
Schedule make_zb_v(int ranks, int microbatches);

// The controllable-memory V schedules (Qi et al., "Pipeline Parallelism with Controllable
// Memory", arXiv 2405.15362): ZB-V's placement (stages r and 2P-1-r on rank r) and split
// backward, but a repeating block per microbatch that keeps each activation stash for a shorter
// time, trading part of ZB-V's bubble for memory. The W's are not deferred: each runs in the
// first free step after its I, so the stash that W still needs is held about as long as the
// activations themselves.
//
// Peak activations, in the simulator's unit (microbatches of the rank's whole share, a chunk's
// stash counting 1/2: the unit in which 1F1B and ZB-V peak at P, and the paper's), when M >= P:
//   V-Half  (P+2)/2 (integer division): about 1/2 of 1F1B's P
//   V-Min   (P+4)/3 (integer division): about 1/3 of 1F1B's P
// counting each stash until its W ends, as the paper does (CostModel::stage_weight_stash equal
// to the chunk's activation). The simulator's default, which frees a stash when its I ends and
// does not count W's smaller stash, gives the same for V-Half and at most that for V-Min. Fewer
// microbatches never peak higher.
//
// Bubble (cost - busy, every rank, M >= P) at F = I = W = T (T for the rank's whole share):
//   V-Half  (7P-4)T/4 for even P, 7(P-1)T/4 for odd P: about 7/12 of 1F1B's 3(P-1)T
//   V-Min   (4P-5)T/2, or (4P-3)T/2 when P is a multiple of 3 (0 for P = 1): about 2/3 of it
// so the bubble ratio b / (3MT + b) is about 7P/12M for V-Half and 2P/3M for V-Min. The paper
// gives ~P/2M and ~2P/3M. Its reference implementation also reorders the warm-up and cool-down
// under the memory limit, which does not shorten V-Min but does V-Half (2.5T where this one has
// 6T at P = 4, 8.5T where it has 13T at P = 8); without that, V-Half's bubble is above V-Min's
// for P < 6. Any costs keep the order valid, but the block runs at the pace of equal costs:
// V-Min's bubble grows with M as soon as F, I and W differ, V-Half's when 2F > 2I + W or
// 2I > 2F + W (the paper's condition for its half-memory schedule; at F = I = 1, W = 1/4 its
// bubble stays flat).
Schedule make_v_half(int ranks, int microbatches);
Schedule make_v_min(int ranks, int microbatches);

// DualPipeV (DeepSeek's DualPipe folded into a V; torch.distributed.pipelining's
// ScheduleDualPipeV, whose order this is action for action): ZB-V's placement, M >= 2P. Rank r,
// with lower stage r and upper stage 2P-1-r, runs eight phases:
//   1. 2(P-1-r) forwards of the lower stage
//   2. r+1 pairs: forward lower, forward upper
//   3. P-1-r triples: I upper, its W, forward upper
//   4. M-2P+r+1 pairs of OVERLAP_F_B: (F lower; B upper), (F upper; B lower); on the last rank
//      the first (F lower; B upper) runs as two plain actions
//   5. P-1-r pairs: B upper, (F upper; B lower)
//   6. r+1 pairs of backwards, upper then lower: B's, then I's from the middle pair on (for odd
//      r from its upper backward, for even r from its lower one)
//   7. P-1-r pairs: a waiting W, a lower I
//   8. the r+1 W's still waiting
// W's run in the order of their I's. An OVERLAP_F_B is meant to hide one microbatch's
// communication behind another's compute; the simulator and the runtime run its parts one after
// the other (the simulator charges the sum), so the figures below are without that gain.
// At F = I = W = T, for every M >= 2P: bubble (P-1)T on every rank (cost - busy), a third of
// 1F1B's 3(P-1)T; peak activations P + 1/2 microbatches of the rank's share on every rank (2P+1
// chunk stashes; a composite counts its forward's stash from its start and its backward's until
// its end).
Schedule make_dualpipev(int ranks, int microbatches);

// Replicated stages (Schedule::placement, schedule.h). Each replica of a stage runs the F and B
// of its own microbatches; the replicas of a stage sum their gradients at the step's end
// (add_grad_reductions, reductions.h, adds those REDUCE_GRADs). F and B here are the times of one
// stage (one rank's whole share, V = 1) for one microbatch.

// Chimera (Li & Hoefler, SC'21): two pipelines in opposite directions over P ranks, P even.
// Rank r holds stage r of the "down" pipeline and stage P-1-r of the "up" one (stage s on ranks
// s and P-1-s); microbatches 0 .. M/2-1 go down, M/2 .. M-1 up. The basic unit (M = P) runs P/2
// microbatches each way, each direction in 1F1B order on its own stages, the two merged rank by
// rank in unit steps, lower microbatch index within its direction first: for P = 4 (down 0, 1;
// up 2, 3; stages 0..3 on ranks 0..3 going down)
//   rank 0: 0F0 0F1 3F2 3B2 3F3 3B3 0B0 0B1
//   rank 1: 1F0 2F2 1F1 2F3 2B2 1B0 2B3 1B1
//   rank 2: 1F2 2F0 1F3 2F1 2B0 1B2 2B1 1B3
//   rank 3: 0F2 0F3 3F0 3B0 3F1 3B1 0B2 0B3
// M a multiple of P runs M/P units one after the other (the paper's direct concatenation),
// unit u on down microbatches u P/2 .. u P/2 + P/2 - 1 and up M/2 + u P/2 ...
// Bubble (cost - busy, every rank) (M/P)(P-2) max(F, B): (P-2)(F+B)/2 per unit when F = B, the
// paper's P-2 bubbles of a unit at half of 1F1B's 2(P-1) (as the paper, the unit's order is made
// for F = B; with B = 2F the same order idles (P-2)B); the units do not overlap, so the bubble
// grows with M/P (the paper's forward doubling and backward halving, not built here, remove that).
// Peak activations (the simulator's unit, any F, B and --mem-w-ratio: the B's are fused), counted
// over both stages of a rank: P/2 + 1 + min(r, P-1-r) on rank r, from P/2 + 1 on the end ranks
// to P in the middle (the paper's [P/2 + 1, P], against 1F1B's P - r), whatever M/P. Each rank
// also holds the weights of two stages. Needs P even and M a multiple of P.
Schedule make_chimera(int ranks, int microbatches);

// GEMS (Jain et al., SC'20, MAST): Chimera's placement and direction of the microbatches, but one
// microbatch in flight per direction: microbatch j of a direction runs its forward through every
// stage and its backward back before microbatch j+1 of that direction starts. The two directions
// go together and cross in the middle; rank r runs, for j = 0 .. M/2-1, the forward of the
// direction that reaches it first (down for r < P/2), the other's forward, the other's backward,
// then the first's backward:
//   rank 0 (P = 4, M = 4): 0F0 3F2 3B2 0B0 0F1 3F3 3B3 0B1
// Bubble (M/2)(P-2)(F+B) per rank: each round of two microbatches takes P(F+B) and keeps a rank
// busy 2(F+B), a bubble ratio of (P-2)/P whatever M (the seeds' 1 - Theta(1/P)); 0 for P = 2.
// Peak activations 2 on every rank (one microbatch per direction: at most one stash per stage).
// Needs P even and M even.
Schedule make_gems(int ranks, int microbatches);

// WPipe (group-based interleaved, ICLR 2022), an asynchronous run of `microbatches` in steps of
// `period` (the weight rule kWPipe, schedule/weight_versions.h). V = 2, stage s on rank s mod P:
// the first group (stages 0 .. P-1) and the second (P .. 2P-1) each span every rank. The forward
// of step k's microbatches on a stage waits until the stage holds the version the rule gives it:
// on the second group W^(k), after the stage's backwards of step k-1 (its order is kept, a flush
// per group and step); on the first group W^(k-1), after its backwards of step k-2, so the
// first group runs step k+1's forwards ahead of step k's backwards and fills the second group's
// flush. The two groups step at alternating times. Built by a greedy list scheduler with F = 1,
// B = 2 on every stage: a free rank runs a ready B (second group first), else a ready F (second
// group first), each stage in microbatch order; forwards of a later step than the oldest one
// still running on the stage wait while the rank holds 2P stashes (so the oldest step never
// waits for memory and the run cannot deadlock). Peak activations at most 2P chunk stashes (P
// microbatches of the rank's share) beyond the oldest step's.
Schedule make_wpipe(int ranks, int microbatches, int period);

// 1F1B-RR (PipeDream's round robin): stage s has replicas_per_stage[s] = r_s replicas on
// consecutive ranks, the stages in order ([3, 1]: stage 0 on ranks 0..2, stage 1 on rank 3), and
// microbatch i runs stage s on its replica i mod r_s (forward and backward alike). Every replica
// runs its own microbatches in 1F1B order with ceil(sum_{t >= s} r_t / r_s) - 1 warm-up forwards
// (1F1B's P-1-s when every r_s is 1). Needs M >= max r_s, so that every replica has work. The
// registry's 1f1b-rr (generators/families/round_robin.cpp); `pptrain schedule --schedule 1f1b-rr
// --replicas 3,1` shows it. With one replica everywhere it is 1F1B's order with a placement.
Schedule make_1f1b_rr(const std::vector<int>& replicas_per_stage, int microbatches);

// The one-process run of `stages` stages on one rank: each microbatch's forwards through every
// stage, then its backwards, one microbatch after the other. It is the reference an
// asynchronous schedule's pipeline must reproduce (`pptrain train --pp 1 --stages S`), and, with
// `flushes`, a synchronous run split into stages. Not a registry entry.
Schedule make_serial(int stages, int microbatches, bool flushes);

// The conditions every generator puts on its sizes: UserError naming the schedule unless ranks
// >= 1 and microbatches >= 1, and ranks x chunks x microbatches is not beyond what a schedule
// holds.
void check_generator_sizes(const char* name, int ranks, int microbatches, int chunks = 1);

}  // namespace pptrain
