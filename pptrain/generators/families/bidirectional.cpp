// The bidirectional family: two pipelines in opposite directions over the same ranks, so every
// stage has two replicas whose gradients are reduced after the flush (schedule/reductions.h);
// synchronous. Chimera and GEMS (generators/generators.h) put one stage per rank in each direction.
//
// BitPipe (Wu, Chen and Yu, 2024), generated here: two V-shaped pipelines in opposite directions
// over the same P ranks. The model is cut into 2P stages; the first half of the microbatches
// ("down") runs them down the ranks and back up (stage s on rank s, then 2P-1-s: ZB-V's placement),
// the second half ("up") on the mirror image (stage s on rank P-1-s, then s-P). Every rank so holds
// four stages, two of each direction; every stage has two replicas, whose gradients are summed
// after the flush (schedule/reductions.h); and the turn of each V is a copy on one rank, not a
// message. Synchronous: it equals one process (`--pp 1`).
//
// Each direction runs ZB-V's order for its M/2 microbatches with whole backwards (each I taken as
// the B, its W dropped); the two orders are merged rank by rank as Chimera merges its two
// directions: in time (F = 1, B = 2), a free rank starts the next action of either direction whose
// input is there, the lower index within its direction first, then a backward, then down. Each
// direction's order is deadlock-free on its own and waits on nothing of the other, so the merge
// always finishes. At F = I = W it leaves less bubble than interleaved-1f1b and Chimera (P = 8, M =
// 32: 7% against 10% and 33%), holding up to twice 1F1B's activations.
#include <algorithm>
#include <array>
#include <tuple>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/generators/families/families.h"
#include "pptrain/generators/generators.h"

namespace pptrain {
namespace {

// The rank of stage `stage` of 2P in direction 0 (down) or 1 (up).
int bitpipe_rank(int ranks, int stage, int direction) {
  const int down = stage < ranks ? stage : 2 * ranks - 1 - stage;
  return direction == 0 ? down : ranks - 1 - down;
}

Schedule make_bitpipe(const ScheduleOptions& o) {
  const int P = o.ranks, M = o.microbatches, S = 2 * P, half = M / 2;
  check_generator_sizes("bitpipe", P, M, 2);
  PPTRAIN_CHECK(P >= 2 && P % 2 == 0, "schedule 'bitpipe' needs an even number of ranks (its ",
                "two pipelines cross in the middle), got ", P);
  PPTRAIN_CHECK(M >= 2 && M % 2 == 0, "schedule 'bitpipe' needs an even number of microbatches ",
                "(half go each way), got ", M);
  Schedule s;
  s.name = "bitpipe";
  s.num_ranks = P;
  s.num_stages = S;
  s.num_microbatches = M;
  s.actions.resize(P);
  s.placement.assign(S, std::vector<int>(M));
  for (int stage = 0; stage < S; ++stage) {
    s.stage_to_rank.push_back(std::min(bitpipe_rank(P, stage, 0), bitpipe_rank(P, stage, 1)));
    for (int m = 0; m < M; ++m) s.placement[stage][m] = bitpipe_rank(P, stage, m < half ? 0 : 1);
  }

  // [rank][direction]: the direction's own order on the rank.
  const Schedule v = make_zb_v(P, half);
  std::vector<std::array<std::vector<Action>, 2>> order(P);
  for (int r = 0; r < P; ++r) {
    for (const Action& a : v.actions[r]) {
      if (a.op == Op::W) continue;
      const Op op = a.op == Op::I ? Op::B : a.op;
      order[r][0].push_back(Action::make(op, a.stage, a.microbatch));
      order[P - 1 - r][1].push_back(Action::make(op, a.stage, half + a.microbatch));
    }
  }

  constexpr int kForward = 1, kBackward = 2;
  // [microbatch][stage]: when its F (B) ends; -1 until it is placed.
  std::vector<std::vector<int>> forward_end(M, std::vector<int>(S, -1));
  std::vector<std::vector<int>> backward_end(M, std::vector<int>(S, -1));
  const auto ready = [&](const Action& a, int now) {
    const auto ended = [&](int t) { return t >= 0 && t <= now; };
    const int m = a.microbatch;
    if (a.op == Op::F) return a.stage == 0 || ended(forward_end[m][a.stage - 1]);
    return ended(forward_end[m][a.stage]) &&
           (a.stage == S - 1 || ended(backward_end[m][a.stage + 1]));
  };
  const auto preference = [&](const Action& a, int direction) {
    return std::make_tuple(a.microbatch - direction * half, a.op == Op::B ? 0 : 1, direction);
  };
  std::vector<std::array<size_t, 2>> next(P, {0, 0});
  std::vector<int> free_at(P, 0);
  const long long total = 2LL * S * M;
  long long placed = 0;
  for (int now = 0; placed < total; ++now) {
    PPTRAIN_ASSERT(now <= 2 * kBackward * total, "bitpipe's merge does not finish for P=", P,
                   ", M=", M);
    for (int r = 0; r < P; ++r) {
      if (free_at[r] > now) continue;
      int pick = -1;
      for (int d = 0; d < 2; ++d) {
        if (next[r][d] == order[r][d].size()) continue;
        const Action& a = order[r][d][next[r][d]];
        if (!ready(a, now)) continue;
        if (pick < 0 || preference(a, d) < preference(order[r][pick][next[r][pick]], pick)) {
          pick = d;
        }
      }
      if (pick < 0) continue;
      const Action a = order[r][pick][next[r][pick]++];
      s.actions[r].push_back(a);
      free_at[r] = now + (a.op == Op::F ? kForward : kBackward);
      (a.op == Op::F ? forward_end : backward_end)[a.microbatch][a.stage] = free_at[r];
      ++placed;
    }
  }
  return s;
}

constexpr const char* kBitPipeSummary =
    "BitPipe: two V-shaped pipelines in opposite directions, each stage on two ranks, half the "
    "microbatches each way; less bubble than interleaved-1f1b and chimera, up to twice 1F1B's "
    "activations; P and M even";

}  // namespace

std::vector<ScheduleEntry> bidirectional_family() {
  ScheduleEntry bitpipe{"bitpipe", 2, 2, 2, kBitPipeSummary, make_bitpipe};
  // Not searched by `pptrain plan`: its memory model holds (tests/memory_test.cpp), but its
  // actions are half as long as 1F1B's and twice as many, and the planner counts no cost per
  // action, so it would predict bitpipe ahead of 1F1B where it measured 0.88x (docs/CLI.md).
  bitpipe.planned = false;
  return {
      {"chimera", 1, 1, 1,
       "Chimera: two pipelines in opposite directions, stage s on ranks s and P-1-s, half the "
       "microbatches each way; bubble (P-2) max(F, B) per P microbatches; P even, M a "
       "multiple of P",
       without_chunks<make_chimera>},
      {"gems", 1, 1, 1,
       "GEMS: Chimera's two replicas, one microbatch in flight per direction; 2 microbatches of "
       "activations, bubble ratio (P-2)/P; P and M even",
       without_chunks<make_gems>},
      bitpipe,
  };
}

}  // namespace pptrain
