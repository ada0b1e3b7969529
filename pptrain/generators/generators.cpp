#include "pptrain/generators/generators.h"

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// An empty schedule with stage s on rank s % P (for V = 1 simply stage r on rank r).
Schedule empty_schedule(const std::string& name, int ranks, int microbatches, int chunks) {
  Schedule s;
  s.name = name;
  s.num_ranks = ranks;
  s.num_stages = ranks * chunks;
  s.num_microbatches = microbatches;
  s.stage_to_rank.resize(s.num_stages);
  for (int stage = 0; stage < s.num_stages; ++stage) s.stage_to_rank[stage] = stage % ranks;
  s.actions.resize(ranks);
  return s;
}

// An empty schedule in a V: two stages per rank, rank r holding stages r and 2P-1-r, so the
// model goes down the ranks and back up and the last stage is on rank 0 again.
Schedule v_shaped_schedule(const std::string& name, int ranks, int microbatches) {
  Schedule s = empty_schedule(name, ranks, microbatches, 2);
  for (int stage = ranks; stage < 2 * ranks; ++stage)
    s.stage_to_rank[stage] = 2 * ranks - 1 - stage;
  return s;
}

// The one-forward-one-backward family on one stage per rank. Rank r runs `warmup[r]` forwards,
// then pairs of (next forward, oldest backward) while forwards remain, then the remaining
// backwards. With `split`, each backward is an I, and the matching W follows as soon as more than
// `deferred[r]` W's are waiting; the rest drain at the end. Without `split` backwards are B's.
//
// 1F1B is warmup P-1-r, fused. ZB-H1 and ZB-H2 keep this frame and defer W's on the later ranks,
// whose tail would otherwise idle while the gradients of the last microbatches travel back to
// rank 0: deferring r W's on rank r (2r for ZB-H2) fills exactly that wait with useful work.
Schedule one_f_one_b_family(const std::string& name, int ranks, int microbatches,
                            const std::vector<int>& warmup, const std::vector<int>& deferred,
                            bool split) {
  Schedule s = empty_schedule(name, ranks, microbatches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[r];
    int forwards = 0, backwards = 0, weights = 0;
    const auto backward = [&] {
      list.emplace_back(split ? Op::I : Op::B, r, backwards++);
      if (split && backwards - weights > deferred[r]) {
        list.emplace_back(Op::W, r, weights++);
      }
    };
    while (forwards < std::min(warmup[r], microbatches)) list.emplace_back(Op::F, r, forwards++);
    while (backwards < microbatches) {
      if (forwards < microbatches) list.emplace_back(Op::F, r, forwards++);
      backward();
    }
    while (split && weights < microbatches) list.emplace_back(Op::W, r, weights++);
  }
  return s;
}

// ZB-V by list scheduling in unit time steps (every F, I and W of a chunk costs 1).
//
// At each step every idle rank starts one action that is ready at that moment, chosen by:
//   1. a W, if 2P W's are already waiting (bounds the weight-gradient stash like activations);
//   2. an F, if fewer than 2P chunk stashes (P microbatches of the rank's share) are held,
//      upper chunk (stage 2P-1-r) first: its output is what the turn of the V is waiting for;
//   3. an I, lower chunk (stage r) first;
//   4. a W, upper chunk first.
// Forwards before backwards fills the memory budget early, which leaves slack between each F and
// its I: the fixed order then keeps a bubble that stays flat as M grows when F, I and W differ.
// Among the priority orders we tried, this one alone gave zero bubble at F = I = W, peak <= P and
// that flat bubble (I-first orders did too for equal costs but their bubble grew linearly with M
// at F=1, I=2, W=1). Within a stage, F's and I's go in microbatch order.
Schedule zb_v_list_schedule(int ranks, int microbatches) {
  const int P = ranks, M = microbatches, S = 2 * ranks;
  Schedule s = v_shaped_schedule("zb-v", P, M);
  for (auto& list : s.actions) list.reserve(6L * M);  // F, I and W of two stages

  constexpr int kNotYet = -1;
  // Step at which each fact (semantics.h) came true: kNotYet until it has. Read only for inputs
  // from another rank (see inputs_done); a W's weight gradients are no one's input, so a W
  // writes nothing.
  FactTable<int> done_at(S, M, kNotYet);
  // [stage] its next F, I and W: each in microbatch order. A W needs only its I, so the W's
  // waiting on a stage are those of microbatches next_w .. next_i - 1, and the first says
  // whether any is ready.
  std::vector<int> next_f(S, 0), next_i(S, 0), next_w(S, 0);
  std::vector<int> stashes(P, 0);
  // Everything `a` waits for has happened by `step`. A fact of the rank's own stages came true
  // at an earlier step if its action was placed at all, which the counters say: the table's
  // entry of a backward's own forward, about 2P microbatches back, is long out of cache at
  // P = 256, the counters are not.
  const auto inputs_done = [&](const Action& a, int step) {
    for (const Need& need : inputs_of(a, s.stage_to_rank, /*lowered=*/false)) {
      if (s.stage_to_rank[need.stage] == s.stage_to_rank[a.stage]) {
        const auto& next = need.fact == Fact::kOutput ? next_f : next_i;
        if (next[need.stage] <= need.microbatch) return false;
      } else if (done_at[need] == kNotYet || done_at[need] > step) {
        return false;
      }
    }
    return true;
  };

  const long total = 3L * S * M;
  long scheduled = 0;
  for (int step = 0; scheduled < total; ++step) {
    long before = scheduled;
    for (int r = 0; r < P; ++r) {
      const int lower = r, upper = S - 1 - r;
      const auto f_ready = [&](int stage) {
        const int m = next_f[stage];
        return m < M && stashes[r] < S && inputs_done(Action(Op::F, stage, m), step);
      };
      const auto i_ready = [&](int stage) {
        const int m = next_i[stage];
        return m < M && inputs_done(Action(Op::I, stage, m), step);
      };
      const auto w_ready = [&](int stage) {
        const int m = next_w[stage];
        return m < next_i[stage] && inputs_done(Action(Op::W, stage, m), step);
      };
      // A W ready at this step, upper chunk first: its stage, or -1.
      const int w_stage = w_ready(upper) ? upper : w_ready(lower) ? lower : -1;
      const int waiting = next_i[upper] - next_w[upper] + next_i[lower] - next_w[lower];

      // Written field by field: an Action built whole and copied stalls the store it is read
      // back from (docs/PERFORMANCE.md).
      Op op;
      int st;
      if (w_stage >= 0 && waiting >= S) {
        op = Op::W, st = w_stage;
      } else if (f_ready(upper)) {
        op = Op::F, st = upper;
      } else if (f_ready(lower)) {
        op = Op::F, st = lower;
      } else if (i_ready(lower)) {
        op = Op::I, st = lower;
      } else if (i_ready(upper)) {
        op = Op::I, st = upper;
      } else if (w_stage >= 0) {
        op = Op::W, st = w_stage;
      } else {
        continue;  // nothing ready: this rank idles for one step
      }

      int mb;
      if (op == Op::F) {
        mb = next_f[st]++;
        ++stashes[r];
      } else if (op == Op::I) {
        mb = next_i[st]++;
        --stashes[r];
      } else {
        mb = next_w[st]++;
      }
      const Action& chosen = s.actions[r].emplace_back(op, st, mb);
      if (op != Op::W) done_at[produced_by(chosen)] = step + 1;
      ++scheduled;
    }
    // Every action lasts one step, so a step in which nobody starts anything changes nothing.
    PPTRAIN_ASSERT(scheduled > before, "zb-v list scheduler stuck at step ", step, " (P=", P,
                   ", M=", M, ")");
  }
  return s;
}

// The controllable-memory V schedules (arXiv 2405.15362) built from a repeating block.
//
// Time runs in unit steps, one chunk action each. Rank r starts the four actions of microbatch k
// that take or free activations at fixed offsets plus 6k: F of its lower stage (r), F of its
// upper stage (2P-1-r), I of the upper stage, I of the lower stage. The offsets respect every
// dependency for microbatch 0 and are distinct modulo 6, so the block repeats every 6 steps
// without collisions, and each period leaves the rank two free steps: the two W's of a microbatch
// go there, each W to the first free step after its I, in the order of the I's. A rank's list is
// its timetable read in time order. The timetable leaves gaps in the warm-up and cool-down; the
// simulator and the runtime start every action as soon as its inputs are there, which closes them.
//
// A stash lives from its F to its I, so the offsets set the memory: one microbatch enters every 6
// steps, so a rank holds about (lifetime of the lower stash + lifetime of the upper one) / 6 chunk
// stashes at once (generators.h gives the exact peaks). The two blocks below are the paper's
// (the stable patterns of its reference implementation); the W placement and the rest are ours.
struct VBlock {
  int f_lower = 0, f_upper = 0, i_upper = 0, i_lower = 0;  // steps from the block's start
};

Schedule v_block_schedule(const std::string& name, int ranks, int microbatches,
                          const std::function<VBlock(int rank)>& block_of) {
  constexpr int kPeriod = 6;
  Schedule s = v_shaped_schedule(name, ranks, microbatches);
  const int upper_base = 2 * ranks - 1;
  for (int r = 0; r < ranks; ++r) {
    const VBlock b = block_of(r);
    const int lower = r, upper = upper_base - r;
    const std::pair<int, Action> starts[] = {{b.f_lower, Action::make(Op::F, lower, 0)},
                                             {b.f_upper, Action::make(Op::F, upper, 0)},
                                             {b.i_upper, Action::make(Op::I, upper, 0)},
                                             {b.i_lower, Action::make(Op::I, lower, 0)}};
    int last = 0;
    for (const auto& start : starts) last = std::max(last, start.first);
    // timetable[t]: the action starting at step t, or none (a free step).
    std::vector<std::optional<Action>> timetable((microbatches - 1) * kPeriod + last + 1);
    for (int k = 0; k < microbatches; ++k) {
      for (const auto& [offset, action] : starts) {
        auto& at = timetable[k * kPeriod + offset];
        PPTRAIN_ASSERT(!at, name, ": two actions at step ", k * kPeriod + offset, " of rank ", r);
        at = Action::make(action.op, action.stage, k);
      }
    }
    std::deque<Action> waiting_w;
    auto& list = s.actions[r];
    for (const auto& at : timetable) {
      if (at) {
        list.push_back(*at);
        if (at->op == Op::I) waiting_w.emplace_back(Op::W, at->stage, at->microbatch);
      } else if (!waiting_w.empty()) {
        list.push_back(waiting_w.front());
        waiting_w.pop_front();
      }
    }
    list.insert(list.end(), waiting_w.begin(), waiting_w.end());
  }
  return s;
}

// DualPipeV in the order torch.distributed.pipelining's ScheduleDualPipeV gives rank r (see
// generators.h for the eight phases). The writer keeps, per stage, the next microbatch to run
// forward and backward (an I or a B, whichever comes), and the W's still owed in the order of
// their I's; a W is written only when one is owed.
class DualPipeVWriter {
 public:
  DualPipeVWriter(int stages, std::vector<Action>* list)
      : next_f_(stages, 0), next_back_(stages, 0), list_(list) {}

  Action forward(int stage) { return Action::make(Op::F, stage, next_f_[stage]++); }
  // An I (which owes a W) or a fused B.
  Action backward(int stage, bool split) {
    const Action a = Action::make(split ? Op::I : Op::B, stage, next_back_[stage]++);
    if (split) owed_w_.emplace_back(Op::W, stage, a.microbatch);
    return a;
  }
  void add(const Action& a) { list_->push_back(a); }
  void add_overlapped(int forward_stage, int backward_stage) {
    const Action f = forward(forward_stage);
    add(Action::overlap({f, backward(backward_stage, /*split=*/false)}));
  }
  void add_owed_w() {
    if (owed_w_.empty()) return;
    add(owed_w_.front());
    owed_w_.pop_front();
  }

 private:
  std::vector<int> next_f_, next_back_;
  std::deque<Action> owed_w_;
  std::vector<Action>* list_;
};

// Largest number of (stage, microbatch) pairs we generate: beyond it the lists alone take
// gigabytes, which is a typo in the options rather than a pipeline.
constexpr long long kMaxStageMicrobatches = 50'000'000;

// 1F1B: P-1-r warm-up forwards on rank r, each backward whole (B) or an I with its W right after.
Schedule one_f_one_b(int ranks, int microbatches, bool split) {
  check_generator_sizes("1f1b", ranks, microbatches);
  std::vector<int> warmup(ranks), deferred(ranks, 0);
  for (int r = 0; r < ranks; ++r) warmup[r] = ranks - 1 - r;
  return one_f_one_b_family("1f1b", ranks, microbatches, warmup, deferred, split);
}

}  // namespace

void check_generator_sizes(const char* name, int ranks, int microbatches, int chunks) {
  PPTRAIN_CHECK(ranks >= 1, "schedule '", name, "': ranks must be >= 1, got ", ranks);
  PPTRAIN_CHECK(microbatches >= 1, "schedule '", name, "': microbatches must be >= 1, got ",
                microbatches);
  const long long pairs = 1LL * ranks * chunks * microbatches;
  PPTRAIN_CHECK(pairs <= kMaxStageMicrobatches, "schedule '", name, "': ranks x chunks x ",
                "microbatches = ", pairs, " is too large (at most ", kMaxStageMicrobatches, ")");
}

Schedule make_gpipe(int ranks, int microbatches) {
  check_generator_sizes("gpipe", ranks, microbatches);
  Schedule s = empty_schedule("gpipe", ranks, microbatches, 1);
  for (int r = 0; r < ranks; ++r) {
    for (int m = 0; m < microbatches; ++m) s.actions[r].emplace_back(Op::F, r, m);
    for (int m = 0; m < microbatches; ++m) s.actions[r].emplace_back(Op::B, r, m);
  }
  return s;
}

Schedule make_1f1b(int ranks, int microbatches) {
  return one_f_one_b(ranks, microbatches, /*split=*/false);
}

Schedule make_interleaved_1f1b(int ranks, int microbatches, int chunks) {
  check_generator_sizes("interleaved-1f1b", ranks, microbatches, std::max(chunks, 1));
  PPTRAIN_CHECK(chunks >= 2, "schedule 'interleaved-1f1b' needs chunks >= 2 (virtual stages per ",
                "rank), got chunks=", chunks, "; use '1f1b' for one chunk");
  PPTRAIN_CHECK(microbatches < ranks || microbatches % ranks == 0,
                "schedule 'interleaved-1f1b' needs microbatches to be a multiple of ranks, or ",
                "fewer than ranks (Megatron's schedule runs microbatches in groups of P per ",
                "chunk), got microbatches=", microbatches, " with ranks=", ranks);
  const int P = ranks, V = chunks;
  // Megatron-LM runs every forward first when M == P; the general warm-up below already gives
  // the (P-1)(F+B)/V bubble there, so there is no special case.
  Schedule s = empty_schedule("interleaved-1f1b", P, microbatches, V);
  // Each rank walks k = 0 .. M*V-1 "virtual microbatches": groups of G = P microbatches go
  // through chunk 0, then the same group through chunk 1, ..., then the next group. Backwards
  // visit the chunks in reverse. This grouping is why M must be a multiple of P; fewer than P
  // microbatches make one group of G = M, walked by the same rule (as torch's
  // ScheduleInterleaved1F1B, whose rounds are min(M, P) microbatches).
  const int G = std::min(microbatches, P);
  const int total = microbatches * V;
  for (int r = 0; r < P; ++r) {
    const auto microbatch_of = [&](int k) { return (k / (G * V)) * G + k % G; };
    const auto forward = [&](int k) {
      return Action::make(Op::F, ((k / G) % V) * P + r, microbatch_of(k));
    };
    const auto backward = [&](int k) {
      return Action::make(Op::B, (V - 1 - (k / G) % V) * P + r, microbatch_of(k));
    };
    // Enough warm-up forwards that the first backward on every chunk finds its gradient ready:
    // one group per extra chunk, plus two for every rank after this one (1F1B's offset).
    const int warmup = std::min(total, (V - 1) * G + 2 * (P - 1 - r));
    auto& list = s.actions[r];
    for (int k = 0; k < warmup; ++k) list.push_back(forward(k));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(forward(warmup + k));
      list.push_back(backward(k));
    }
    for (int k = std::max(0, total - warmup); k < total; ++k) list.push_back(backward(k));
  }
  return s;
}

Schedule make_zb_h1(int ranks, int microbatches) {
  check_generator_sizes("zb-h1", ranks, microbatches);
  std::vector<int> warmup(ranks), deferred(ranks);
  for (int r = 0; r < ranks; ++r) {
    warmup[r] = ranks - 1 - r;
    deferred[r] = r;
  }
  return one_f_one_b_family("zb-h1", ranks, microbatches, warmup, deferred, /*split=*/true);
}

Schedule make_1f1b_split(int ranks, int microbatches) {
  return one_f_one_b(ranks, microbatches, /*split=*/true);
}

Schedule make_zb_h2(int ranks, int microbatches) {
  check_generator_sizes("zb-h2", ranks, microbatches);
  std::vector<int> warmup(ranks), deferred(ranks);
  for (int r = 0; r < ranks; ++r) {
    warmup[r] = 2 * (ranks - 1 - r);
    deferred[r] = 2 * r;
  }
  return one_f_one_b_family("zb-h2", ranks, microbatches, warmup, deferred, /*split=*/true);
}

Schedule make_zb_v(int ranks, int microbatches) {
  check_generator_sizes("zb-v", ranks, microbatches, 2);
  return zb_v_list_schedule(ranks, microbatches);
}

// V-Half: the forwards go down the V two steps apart (one free step per hop) and come back up
// without a gap; the upper chunk's I's go down two steps apart, the lower chunk's come back
// without a gap. For even P those offsets would put F of the upper stage and I of the lower one
// on the same step modulo 6, so both I's move 3 steps later.
Schedule make_v_half(int ranks, int microbatches) {
  check_generator_sizes("v-half", ranks, microbatches, 2);
  const int P = ranks, shift = P % 2 == 0 ? 3 : 0;
  return v_block_schedule("v-half", P, microbatches, [&](int r) {
    return VBlock{2 * r, 3 * P - 2 - r, 3 * P - 1 + 2 * r + shift, 6 * P - 2 - r + shift};
  });
}

// V-Min: every action starts the step its input is ready, all the way down and back. For P a
// multiple of 3 that puts an F and an I of the same rank on one step modulo 6, so both I's move
// 2 steps later.
Schedule make_v_min(int ranks, int microbatches) {
  check_generator_sizes("v-min", ranks, microbatches, 2);
  const int P = ranks, shift = P % 3 == 0 ? 2 : 0;
  return v_block_schedule("v-min", P, microbatches, [&](int r) {
    return VBlock{r, 2 * P - 1 - r, 2 * P + r + shift, 4 * P - 1 - r + shift};
  });
}

Schedule make_dualpipev(int ranks, int microbatches) {
  check_generator_sizes("dualpipev", ranks, microbatches, 2);
  const int P = ranks, M = microbatches;
  PPTRAIN_CHECK(M >= 2 * P, "schedule 'dualpipev' needs at least as many microbatches as stages ",
                "(2 x ranks = ", 2 * P, "), got microbatches=", M);
  Schedule s = v_shaped_schedule("dualpipev", P, M);
  for (int r = 0; r < P; ++r) {
    const int lower = r, upper = 2 * P - 1 - r;
    const int below = P - 1 - r;  // ranks after this one
    DualPipeVWriter w(s.num_stages, &s.actions[r]);
    for (int k = 0; k < 2 * below; ++k) w.add(w.forward(lower));  // 1
    for (int k = 0; k < r + 1; ++k) {                             // 2
      w.add(w.forward(lower));
      w.add(w.forward(upper));
    }
    for (int k = 0; k < below; ++k) {  // 3
      w.add(w.backward(upper, /*split=*/true));
      w.add_owed_w();
      w.add(w.forward(upper));
    }
    for (int k = 0; k < M - 2 * P + r + 1; ++k) {  // 4
      if (k == 0 && r == P - 1) {
        w.add(w.forward(lower));
        w.add(w.backward(upper, /*split=*/false));
      } else {
        w.add_overlapped(lower, upper);
      }
      w.add_overlapped(upper, lower);
    }
    for (int k = 0; k < below; ++k) {  // 5
      w.add(w.backward(upper, /*split=*/false));
      w.add_overlapped(upper, lower);
    }
    // 6: the backwards split from the middle pair on (for odd r from its upper stage, for even
    // r from its lower one), so the last backwards leave W's to fill the drain.
    bool split = false;
    for (int k = 0; k < r + 1; ++k) {
      if (k == (r + 1) / 2 && r % 2 == 1) split = true;
      w.add(w.backward(upper, split));
      if (k == (r + 1) / 2 && r % 2 == 0) split = true;
      w.add(w.backward(lower, split));
    }
    for (int k = 0; k < below; ++k) {  // 7
      w.add_owed_w();
      w.add(w.backward(lower, split));
    }
    for (int k = 0; k < r + 1; ++k) w.add_owed_w();  // 8
  }
  return s;
}

namespace {

// Two pipelines in opposite directions over P ranks (Chimera, GEMS): stage s on rank s for the
// "down" microbatches 0 .. M/2-1 and on rank P-1-s for the "up" ones M/2 .. M-1.
Schedule bidirectional_schedule(const std::string& name, int ranks, int microbatches) {
  Schedule s;
  s.name = name;
  s.num_ranks = ranks;
  s.num_stages = ranks;
  s.num_microbatches = microbatches;
  s.placement.assign(ranks, std::vector<int>(microbatches));
  for (int stage = 0; stage < ranks; ++stage) {
    s.stage_to_rank.push_back(std::min(stage, ranks - 1 - stage));
    for (int m = 0; m < microbatches; ++m) {
      s.placement[stage][m] = m < microbatches / 2 ? stage : ranks - 1 - stage;
    }
  }
  s.actions.resize(ranks);
  return s;
}

void check_bidirectional(const char* name, int ranks, int microbatches, int multiple_of) {
  check_generator_sizes(name, ranks, microbatches);
  PPTRAIN_CHECK(ranks >= 2 && ranks % 2 == 0, "schedule '", name,
                "' needs an even number of ranks (its two pipelines cross in the middle), got ",
                ranks);
  PPTRAIN_CHECK(
      microbatches % multiple_of == 0, "schedule '", name,
      "' needs microbatches to be a multiple of ", multiple_of,
      multiple_of == 2 ? " (half go each way)" : " (ranks: whole units of P microbatches)",
      ", got ", microbatches);
}

// One step of Chimera's basic unit: the j-th microbatch of a direction (0 down, 1 up).
struct UnitStep {
  Op op = Op::F;
  int stage = 0;
  int direction = 0;
  int index = 0;
};

// Chimera's basic unit (M = P): each direction runs P/2 microbatches in 1F1B order on its own
// placement, and the two are merged rank by rank in unit time steps (every F and B lasting 1): at
// each step a free rank runs the next action of either direction whose input is there, the one
// of the lower microbatch index within its direction first (a backward first on a tie, then
// down). For even P this merge is conflict-free as the paper says, and it finishes in 2P + P - 2
// steps: the (P-2)/2 (F+B) bubble.
std::vector<std::vector<UnitStep>> chimera_unit(int P) {
  const int half = P / 2;
  const auto stage_of = [&](int rank, int direction) {
    return direction == 0 ? rank : P - 1 - rank;
  };
  // [rank][direction] the 1F1B order of that direction's stage on the rank.
  std::vector<std::array<std::vector<UnitStep>, 2>> order(P);
  for (int r = 0; r < P; ++r) {
    for (int d = 0; d < 2; ++d) {
      const int stage = stage_of(r, d);
      auto& list = order[r][d];
      const int warmup = std::min(P - 1 - stage, half);
      int f = 0, b = 0;
      while (f < warmup) list.push_back({Op::F, stage, d, f++});
      while (b < half) {
        if (f < half) list.push_back({Op::F, stage, d, f++});
        list.push_back({Op::B, stage, d, b++});
      }
    }
  }
  // done[op][direction][stage][index]: step at which it ended, -1 until then.
  const auto key = [&](Op op, int d, int stage, int index) {
    return ((static_cast<size_t>(op == Op::B) * 2 + d) * P + stage) * half + index;
  };
  std::vector<int> done(4 * static_cast<size_t>(P) * half, -1);
  const auto ready = [&](const UnitStep& a, int step) {
    const auto has = [&](Op op, int stage) {
      const int t = done[key(op, a.direction, stage, a.index)];
      return t >= 0 && t <= step;
    };
    if (a.op == Op::F) return a.stage == 0 || has(Op::F, a.stage - 1);
    return a.stage == P - 1 ? has(Op::F, a.stage) : has(Op::B, a.stage + 1);
  };
  std::vector<std::vector<UnitStep>> unit(P);
  std::vector<std::array<size_t, 2>> next(P, {0, 0});
  const size_t total = 4 * static_cast<size_t>(P) * half;
  size_t placed = 0;
  for (int step = 0; placed < total; ++step) {
    PPTRAIN_ASSERT(step <= 4 * P * P, "chimera unit for P=", P, " does not finish");
    std::vector<UnitStep> ran;
    for (int r = 0; r < P; ++r) {
      const UnitStep* best = nullptr;
      for (int d = 0; d < 2; ++d) {
        if (next[r][d] >= order[r][d].size()) continue;
        const UnitStep& a = order[r][d][next[r][d]];
        if (!ready(a, step)) continue;
        const auto rank = [](const UnitStep& x) {
          return std::make_tuple(x.index, x.op == Op::B ? 0 : 1, x.direction);
        };
        if (!best || rank(a) < rank(*best)) best = &a;
      }
      if (!best) continue;
      unit[r].push_back(*best);
      ran.push_back(*best);
      ++next[r][best->direction];
      ++placed;
    }
    for (const UnitStep& a : ran) done[key(a.op, a.direction, a.stage, a.index)] = step + 1;
  }
  return unit;
}

// 1F1B-RR's warm-up on a replica of stage s: enough forwards of its own microbatches to cover
// the ranks of stage s and after, ceil(sum_{t >= s} r_t / r_s) in flight, as 1F1B's P - s.
int round_robin_warmup(const std::vector<int>& replicas, int stage) {
  int after = 0;
  for (size_t t = stage; t < replicas.size(); ++t) after += replicas[t];
  return (after + replicas[stage] - 1) / replicas[stage] - 1;
}

}  // namespace

Schedule make_chimera(int ranks, int microbatches) {
  check_bidirectional("chimera", ranks, microbatches, ranks);
  const int P = ranks, M = microbatches, half = P / 2;
  Schedule s = bidirectional_schedule("chimera", P, M);
  const auto unit = chimera_unit(P);
  // Direct concatenation: unit u runs down microbatches u P/2 + j and up M/2 + u P/2 + j.
  for (int u = 0; u < M / P; ++u) {
    for (int r = 0; r < P; ++r) {
      for (const UnitStep& a : unit[r]) {
        const int m = (a.direction == 0 ? 0 : M / 2) + u * half + a.index;
        s.actions[r].emplace_back(a.op, a.stage, m);
      }
    }
  }
  return s;
}

Schedule make_gems(int ranks, int microbatches) {
  check_bidirectional("gems", ranks, microbatches, 2);
  const int P = ranks, M = microbatches;
  Schedule s = bidirectional_schedule("gems", P, M);
  for (int r = 0; r < P; ++r) {
    // The direction whose forward reaches rank r first (down on the first half of the ranks)
    // runs first, and its backward, which comes back later, last.
    const bool down_first = r < P / 2;
    for (int j = 0; j < M / 2; ++j) {
      const Action down = Action::make(Op::F, r, j), up = Action::make(Op::F, P - 1 - r, M / 2 + j);
      const Action& first = down_first ? down : up;
      const Action& second = down_first ? up : down;
      auto& list = s.actions[r];
      list.push_back(first);
      list.push_back(second);
      list.emplace_back(Op::B, second.stage, second.microbatch);
      list.emplace_back(Op::B, first.stage, first.microbatch);
    }
  }
  return s;
}

Schedule make_1f1b_rr(const std::vector<int>& replicas_per_stage, int microbatches) {
  PPTRAIN_CHECK(!replicas_per_stage.empty(), "schedule '1f1b-rr' needs at least one stage");
  long long ranks = 0;
  int most = 0;
  for (size_t s = 0; s < replicas_per_stage.size(); ++s) {
    const int r = replicas_per_stage[s];
    PPTRAIN_CHECK(r >= 1, "schedule '1f1b-rr': stage ", s, " has ", r,
                  " replicas; expected at least 1");
    ranks += r;
    most = std::max(most, r);
  }
  // Beyond this many ranks the sum is a typo, and would overflow the checks below.
  constexpr long long kMaxReplicaRanks = 1 << 20;
  PPTRAIN_CHECK(ranks <= kMaxReplicaRanks, "schedule '1f1b-rr': ", ranks,
                " ranks in all is too many (at most ", kMaxReplicaRanks, ")");
  check_generator_sizes("1f1b-rr", static_cast<int>(ranks), microbatches);
  PPTRAIN_CHECK(microbatches >= most, "schedule '1f1b-rr' needs at least as many microbatches as ",
                "the most replicas of a stage (", most, "), so that every replica runs one; got ",
                microbatches);
  const int S = static_cast<int>(replicas_per_stage.size()), M = microbatches;
  Schedule s;
  s.name = "1f1b-rr";
  s.num_ranks = static_cast<int>(ranks);
  s.num_stages = S;
  s.num_microbatches = M;
  s.placement.assign(S, std::vector<int>(M));
  s.actions.resize(s.num_ranks);
  int base = 0;
  for (int stage = 0; stage < S; ++stage) {
    const int r = replicas_per_stage[stage];
    s.stage_to_rank.push_back(base);
    for (int m = 0; m < M; ++m) s.placement[stage][m] = base + m % r;
    const int warmup = round_robin_warmup(replicas_per_stage, stage);
    for (int k = 0; k < r; ++k) {
      std::vector<int> own;  // this replica's microbatches, in order
      for (int m = k; m < M; m += r) own.push_back(m);
      const int n = static_cast<int>(own.size());
      auto& list = s.actions[base + k];
      int f = 0, b = 0;
      while (f < std::min(warmup, n)) list.emplace_back(Op::F, stage, own[f++]);
      while (b < n) {
        if (f < n) list.emplace_back(Op::F, stage, own[f++]);
        list.emplace_back(Op::B, stage, own[b++]);
      }
    }
    base += r;
  }
  return s;
}

Schedule make_wpipe(int ranks, int microbatches, int period) {
  check_generator_sizes("wpipe", ranks, microbatches, 2);
  PPTRAIN_CHECK(period >= 1 && period <= microbatches, "schedule 'wpipe': microbatches per step ",
                "must be 1 .. ", microbatches, ", got ", period);
  const int P = ranks, N = microbatches, S = 2 * ranks;
  Schedule s = empty_schedule("wpipe", P, N, 2);
  constexpr long kNotYet = -1;
  FactTable<long> done_at(S, N, kNotYet);  // when each fact (semantics.h) came true
  std::vector<int> next_f(S, 0), next_b(S, 0);
  std::vector<std::vector<long>> b_ends(S);  // [stage] end of each of its backwards, in order
  std::vector<int> stashes(P, 0);
  std::vector<long> free_at(P, 0);
  const int cap = 2 * P;
  // Backwards of `stage` ended by `t`.
  const auto backwards_by = [&](int stage, long t) {
    const auto& ends = b_ends[stage];
    return static_cast<int>(std::upper_bound(ends.begin(), ends.end(), t) - ends.begin());
  };
  const auto inputs_done = [&](const Action& a, long t) {
    for (const Need& need : inputs_of(a, s.stage_to_rank, /*lowered=*/false)) {
      if (done_at[need] == kNotYet || done_at[need] > t) return false;
    }
    return true;
  };
  const auto f_ready = [&](int stage, int r, long t) {
    const int i = next_f[stage];
    if (i >= N || !inputs_done(Action::make(Op::F, stage, i), t)) return false;
    const int step = i / period;
    // The version the rule gives step `step` on this stage must exist (steps x period backwards).
    const int version = stage < P ? std::max(0, step - 1) : step;
    if (backwards_by(stage, t) < version * period) return false;
    // The oldest step still running on the stage goes on whatever the stashes.
    return step == next_b[stage] / period || stashes[r] < cap;
  };
  const auto b_ready = [&](int stage, long t) {
    return next_b[stage] < next_f[stage] &&
           inputs_done(Action::make(Op::B, stage, next_b[stage]), t);
  };
  const long total = 2L * S * N;
  long scheduled = 0;
  for (long t = 0; scheduled < total; ++t) {
    PPTRAIN_ASSERT(t <= 3L * total + 3L * S, "wpipe: no progress at step ", t);
    for (int r = 0; r < P; ++r) {
      if (free_at[r] > t) continue;
      const int first = r, second = P + r;
      Action chosen;
      if (b_ready(second, t)) {
        chosen = Action::make(Op::B, second, next_b[second]);
      } else if (b_ready(first, t)) {
        chosen = Action::make(Op::B, first, next_b[first]);
      } else if (f_ready(second, r, t)) {
        chosen = Action::make(Op::F, second, next_f[second]);
      } else if (f_ready(first, r, t)) {
        chosen = Action::make(Op::F, first, next_f[first]);
      } else {
        continue;
      }
      const long end = t + (chosen.op == Op::F ? 1 : 2);
      done_at[produced_by(chosen)] = end;
      if (chosen.op == Op::F) {
        ++next_f[chosen.stage];
        ++stashes[r];
      } else {
        ++next_b[chosen.stage];
        --stashes[r];
        b_ends[chosen.stage].push_back(end);
      }
      free_at[r] = end;
      s.actions[r].push_back(chosen);
      ++scheduled;
    }
  }
  s.flushes = false;
  return s;
}

Schedule make_serial(int stages, int microbatches, bool flushes) {
  PPTRAIN_CHECK(stages >= 1 && microbatches >= 1,
                "a serial run needs stages >= 1 and "
                "microbatches >= 1, got ",
                stages, " and ", microbatches);
  Schedule s;
  s.name = "serial";
  s.num_ranks = 1;
  s.num_stages = stages;
  s.num_microbatches = microbatches;
  s.stage_to_rank.assign(stages, 0);
  s.actions.resize(1);
  s.flushes = flushes;
  for (int m = 0; m < microbatches; ++m) {
    for (int st = 0; st < stages; ++st) s.actions[0].emplace_back(Op::F, st, m);
    for (int st = stages - 1; st >= 0; --st) s.actions[0].emplace_back(Op::B, st, m);
  }
  return s;
}

}  // namespace pptrain
