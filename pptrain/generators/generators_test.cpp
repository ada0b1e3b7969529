// Structure of the generated schedules: every (stage, microbatch) gets exactly one forward and
// one backward (B, or I then W on the same rank), each action sits on its stage's rank, the
// validator accepts the schedule, and bad options are refused with a message naming the value.
// Timing and memory figures are checked against closed forms in pptrain/sim/simulator_test.cpp.
#include "pptrain/generators/generators.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "pptrain/common/check.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

struct Case {
  std::string name;
  int ranks;
  int microbatches;
};

// Chimera, GEMS and BitPipe: two replicas of every stage, P even, M even (chimera: a multiple
// of P).
bool is_bidirectional(const std::string& name) {
  return name == "chimera" || name == "gems" || name == "bitpipe";
}
bool bidirectional_fits(const std::string& name, int p, int m) {
  return p % 2 == 0 && m % (name == "chimera" ? p : 2) == 0;
}

// The (P, M) grid every generator is checked on; interleaved-1f1b takes multiples of P and
// fewer than P.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& name : schedule_names()) {
    for (int p : {1, 2, 3, 4, 5, 8}) {
      for (int m : {1, 2, 3, p, p + 1, 2 * p - 1, 2 * p, 3 * p, 4 * p + 3}) {
        if (m < 1) continue;
        if (name == "interleaved-1f1b" && m > p && m % p != 0) continue;
        if (name == "dualpipev" && m < 2 * p) continue;
        if (is_bidirectional(name) && !bidirectional_fits(name, p, m)) continue;
        cases.push_back({name, p, m});
      }
    }
  }
  return cases;
}

std::string describe(const Case& c) {
  return c.name + " P=" + std::to_string(c.ranks) + " M=" + std::to_string(c.microbatches);
}

TEST(Generators, NamesAreTheDocumentedOnes) {
  EXPECT_EQ(
      schedule_names(),
      (std::vector<std::string>{"gpipe",     "1f1b",     "interleaved-1f1b", "zb-h1",   "zb-h2",
                                "zb-v",      "zb-auto",  "v-half",           "v-min",   "dualpipev",
                                "chimera",   "gems",     "bitpipe",          "1f1b-rr", "pipedream",
                                "2bw",       "pipemare", "avgpipe",          "wpipe",   "ampnet",
                                "spectrain", "xpipe"}));
}

TEST(Generators, EveryStageAndMicrobatchRunsOnceInDependencyOrder) {
  for (const Case& c : all_cases()) {
    // dualpipev has composites and fused and split backwards side by side: its own test below.
    if (c.name == "dualpipev") continue;
    // Replicated stages: their own test below (each action on rank_of, not stage_to_rank).
    if (is_bidirectional(c.name)) continue;
    SCOPED_TRACE(describe(c));
    const Schedule s = make_schedule({c.name, c.ranks, c.microbatches});
    EXPECT_EQ(s.name, c.name);
    EXPECT_EQ(s.num_ranks, c.ranks);
    EXPECT_EQ(s.num_microbatches, c.microbatches);
    EXPECT_EQ(s.num_stages, c.ranks * s.chunks());
    EXPECT_FALSE(s.has_comms());
    const bool split = c.name.rfind("zb-", 0) == 0 || c.name.rfind("v-", 0) == 0;
    EXPECT_EQ(s.has_split_backward(), split);

    // (op, stage, microbatch) -> (rank, position)
    std::map<std::tuple<Op, int, int>, std::pair<int, int>> seen;
    for (int r = 0; r < s.num_ranks; ++r) {
      for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
        const Action& a = s.actions[r][i];
        ASSERT_TRUE(a.op == Op::F || a.op == (split ? Op::I : Op::B) || (split && a.op == Op::W))
            << to_string(a);
        ASSERT_EQ(s.stage_to_rank.at(a.stage), r) << to_string(a);
        ASSERT_TRUE(
            seen.emplace(std::make_tuple(a.op, a.stage, a.microbatch), std::make_pair(r, i)).second)
            << "duplicate " << to_string(a);
      }
    }
    const size_t per_pair = split ? 3 : 2;
    EXPECT_EQ(seen.size(), per_pair * s.num_stages * s.num_microbatches);
    // Same-rank order: a backward after its forward, a W after its I.
    for (const auto& [key, where] : seen) {
      const auto [op, stage, mb] = key;
      if (op == Op::F) continue;
      const Op before = op == Op::W ? Op::I : Op::F;
      const auto earlier = seen.at({before, stage, mb});
      EXPECT_EQ(earlier.first, where.first);
      EXPECT_LT(earlier.second, where.second) << op_name(op) << " of stage " << stage << " mb "
                                              << mb << " runs before its " << op_name(before);
    }
    // Cross-rank order and deadlock freedom: the project's validator (lowers and checks).
    EXPECT_NO_THROW(validate(s));
  }
}

TEST(Generators, Placement) {
  const Schedule inter = make_schedule({"interleaved-1f1b", 4, 8, 3});
  EXPECT_EQ(inter.num_stages, 12);
  for (int s = 0; s < 12; ++s) EXPECT_EQ(inter.stage_to_rank[s], s % 4);
  for (const char* name : {"zb-v", "v-half", "v-min", "dualpipev"}) {
    const Schedule v = make_schedule({name, 4, 8});
    EXPECT_EQ(v.chunks(), 2) << name;
    EXPECT_EQ(v.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0})) << name;
  }
  EXPECT_EQ(make_schedule({"interleaved-1f1b", 2, 4}).chunks(), 2);
}

TEST(Generators, OneFOneBWarmsUpThenAlternates) {
  const int P = 4, M = 6;
  const Schedule s = make_1f1b(P, M);
  for (int r = 0; r < P; ++r) {
    const int warmup = std::min(P - 1 - r, M);
    const auto& list = s.actions[r];
    for (int i = 0; i < warmup; ++i) EXPECT_EQ(list[i], Action::make(Op::F, r, i));
    // Steady state: F(warmup + k), B(k) while forwards remain.
    for (int k = 0; k < M - warmup; ++k) {
      EXPECT_EQ(list[warmup + 2 * k], Action::make(Op::F, r, warmup + k));
      EXPECT_EQ(list[warmup + 2 * k + 1], Action::make(Op::B, r, k));
    }
  }
  EXPECT_EQ(to_csv(make_1f1b(2, 3)), "0F0,0F1,0B0,0F2,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n");
}

TEST(Generators, GpipeRunsAllForwardsFirst) {
  EXPECT_EQ(to_csv(make_gpipe(2, 2)), "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n");
}

TEST(Generators, ZeroBubbleHandcraftedDeferWOnLaterRanks) {
  // Last rank of ZB-H1 defers P-1 W's; rank 0 runs each W right after its I.
  const Schedule h1 = make_zb_h1(3, 4);
  EXPECT_EQ(to_csv(h1),
            "0F0,0F1,0F2,0I0,0W0,0F3,0I1,0W1,0I2,0W2,0I3,0W3\n"
            "1F0,1F1,1I0,1F2,1I1,1W0,1F3,1I2,1W1,1I3,1W2,1W3\n"
            "2F0,2I0,2F1,2I1,2F2,2I2,2W0,2F3,2I3,2W1,2W2,2W3\n");
  // ZB-H2 warms up with 2(P-1-r) forwards.
  const Schedule h2 = make_zb_h2(3, 6);
  for (int r = 0; r < 3; ++r) {
    int leading = 0;
    while (h2.actions[r][leading].op == Op::F) ++leading;
    EXPECT_EQ(leading, 2 * (3 - 1 - r) + 1) << "rank " << r;
  }
}

// Chunk stashes a rank holds at most, walking its list: F takes one, W gives it back (the
// paper's count: a stash lives until its W, the W's own stash included).
int most_stashes_until_w(const std::vector<Action>& list) {
  int held = 0, most = 0;
  for (const Action& a : list) {
    held += a.op == Op::F ? 1 : a.op == Op::W ? -1 : 0;
    most = std::max(most, held);
  }
  return most;
}

// V-Half and V-Min repeat one block per microbatch: once the pipeline is full, every 6 actions
// of a rank are one F, one I and one W of each of its two stages, and a rank never holds more
// than 2 (P+2)/2 and 2 (P+4)/3 chunk stashes (the simulator's peaks, in its unit of the rank's
// whole share, are in pptrain/sim/simulator_test.cpp).
TEST(Generators, ControllableMemoryVsRepeatABlockUnderTheirMemory) {
  for (const std::string name : {"v-half", "v-min"}) {
    for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12}) {
      const int most = 2 * (name == "v-half" ? (p + 2) / 2 : (p + 4) / 3);
      for (int m : {1, 2, p, 2 * p + 1, 5 * p}) {
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        const Schedule s = make_schedule({name, p, m});
        int reached = 0;
        for (int r = 0; r < p; ++r) {
          const int held = most_stashes_until_w(s.actions[r]);
          EXPECT_LE(held, most) << "rank " << r;
          reached = std::max(reached, held);
        }
        if (m >= p) {
          EXPECT_EQ(reached, most);
        }
      }
      // The steady state: a window of 6 in the middle of a long run holds each of the six kinds.
      const Schedule s = make_schedule({name, p, 12 * p});
      for (int r = 0; r < p; ++r) {
        const auto& list = s.actions[r];
        const size_t middle = list.size() / 2;
        std::map<std::pair<Op, int>, int> kinds;
        for (size_t i = middle; i < middle + 6; ++i) ++kinds[{list[i].op, list[i].stage}];
        EXPECT_EQ(kinds.size(), 6u) << name << " P=" << p << " rank " << r;
      }
    }
  }
  // P=2: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; V-Min's block on rank 0 is
  // 0F at step 0, 3F at 3, 3I at 4, 0I at 7, each W in the next free step.
  EXPECT_EQ(to_csv(make_v_min(2, 2)),
            "0F0,3F0,3I0,3W0,0F1,0I0,0W0,3F1,3I1,3W1,0I1,0W1\n"
            "1F0,2F0,2I0,1I0,1F1,2F1,2W0,1W0,2I1,1I1,2W1,1W1\n");
}

// torch.distributed.pipelining's ScheduleDualPipeV for P=2, M=4, as its CSV writer prints it
// (data/torch/ holds more sizes, compared by tests/cli_test.sh through --import).
TEST(Generators, DualPipeVIsTorchsOrder) {
  EXPECT_EQ(to_csv(make_dualpipev(2, 4)),
            "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,"
            "(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3\n"
            "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,"
            "(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,2W3,1W3\n");
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 5 * p + 2}) {
      SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
      const Schedule s = make_dualpipev(p, m);
      EXPECT_NO_THROW(validate(s));
      for (int r = 0; r < p; ++r) {
        // Phases 4 and 5 overlap; the last rank runs its first pair of phase 4 plainly.
        int overlapped = 0, forwards = 0, backwards = 0, weights = 0;
        for (const Action& a : s.actions[r]) {
          overlapped += a.op == Op::OVERLAP_F_B;
          for (const Action& atom : atoms_of(a)) {
            forwards += atom.op == Op::F;
            backwards += atom.op == Op::I || atom.op == Op::B;
            weights += atom.op == Op::W;
          }
          if (a.op == Op::OVERLAP_F_B) {
            ASSERT_EQ(a.parts().size(), 2u);
            EXPECT_EQ(a.parts()[0].op, Op::F);
            EXPECT_EQ(a.parts()[1].op, Op::B);
            EXPECT_NE(a.parts()[0].stage, a.parts()[1].stage);
          }
        }
        EXPECT_EQ(overlapped, 2 * (m - 2 * p + r + 1) - (r == p - 1) + (p - 1 - r)) << "rank " << r;
        EXPECT_EQ(forwards, 2 * m);
        EXPECT_EQ(backwards, 2 * m);
        // One W per I: phase 3's P-1-r, and the P that phases 6 and 7 split.
        EXPECT_EQ(weights, 2 * p - 1 - r) << "rank " << r;
      }
    }
  }
}

TEST(Generators, SingleRankIsAPlainList) {
  for (const auto& name : schedule_names()) {
    if (is_bidirectional(name)) continue;  // two pipelines need an even P
    SCOPED_TRACE(name);
    const Schedule s = make_schedule({name, 1, 3});
    EXPECT_EQ(s.num_ranks, 1);
    EXPECT_EQ(s.actions.size(), 1u);
    EXPECT_NO_THROW(validate(s));
  }
  EXPECT_EQ(to_csv(make_1f1b(1, 2)), "0F0,0B0,0F1,0B1\n");
}

void expect_user_error(const ScheduleOptions& o, const std::string& fragment) {
  try {
    make_schedule(o);
    ADD_FAILURE() << "no error for " << o.name << " P=" << o.ranks << " M=" << o.microbatches
                  << " V=" << o.chunks;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

// Replicated schedules: every (stage, microbatch) has one F and one B, both on the rank the
// placement gives it (rank_of), the B after the F; the validator accepts the schedule with and
// without communication and with its reductions.
void expect_replicated_schedule_runs_each_pair_once(const Schedule& s) {
  ASSERT_TRUE(s.replicated());
  EXPECT_FALSE(s.has_comms());
  std::map<std::tuple<Op, int, int>, std::pair<int, int>> seen;  // -> (rank, position)
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      ASSERT_TRUE(a.op == Op::F || a.op == Op::B) << to_string(a);
      ASSERT_EQ(s.rank_of(a.stage, a.microbatch), r) << to_string(a);
      ASSERT_TRUE(
          seen.emplace(std::make_tuple(a.op, a.stage, a.microbatch), std::make_pair(r, i)).second)
          << "duplicate " << to_string(a);
    }
  }
  ASSERT_EQ(seen.size(), 2u * s.num_stages * s.num_microbatches);
  for (int st = 0; st < s.num_stages; ++st) {
    for (int m = 0; m < s.num_microbatches; ++m) {
      EXPECT_LT(seen.at({Op::F, st, m}).second, seen.at({Op::B, st, m}).second);
    }
  }
  EXPECT_NO_THROW(validate(s));
  EXPECT_NO_THROW(validate(lower(s)));
  EXPECT_NO_THROW(validate(add_grad_reductions(s)));
}

TEST(Generators, ChimeraAndGemsPlaceEachStageOnTwoMirroredRanks) {
  for (const std::string name : {"chimera", "gems"}) {
    for (int p : {2, 4, 6, 8}) {
      for (int m : {p, 2 * p, 3 * p}) {
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        const Schedule s = make_schedule({name, p, m});
        EXPECT_EQ(s.num_stages, p);
        EXPECT_EQ(s.chunks(), 1);
        for (int st = 0; st < p; ++st) {
          const int mirror = p - 1 - st;
          for (int mb = 0; mb < m; ++mb) EXPECT_EQ(s.rank_of(st, mb), mb < m / 2 ? st : mirror);
          EXPECT_EQ(s.replicas_of(st),
                    (std::vector<int>{std::min(st, mirror), std::max(st, mirror)}));
          EXPECT_EQ(s.stage_to_rank[st], std::min(st, mirror));
        }
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(s.stages_of(r),
                    (std::vector<int>{std::min(r, p - 1 - r), std::max(r, p - 1 - r)}));
        }
        expect_replicated_schedule_runs_each_pair_once(s);
      }
    }
  }
  // GEMS also takes any even M.
  expect_replicated_schedule_runs_each_pair_once(make_gems(4, 6));
  expect_replicated_schedule_runs_each_pair_once(make_gems(6, 2));
}

TEST(Generators, BitPipePlacesTwoMirroredVs) {
  for (int p : {2, 4, 6, 8}) {
    for (int m : {2, p, 2 * p + 2, 4 * p}) {
      SCOPED_TRACE("bitpipe P=" + std::to_string(p) + " M=" + std::to_string(m));
      const Schedule s = make_schedule({"bitpipe", p, m});
      EXPECT_EQ(s.num_stages, 2 * p);
      EXPECT_EQ(s.chunks(), 2);
      for (int st = 0; st < 2 * p; ++st) {
        const int down = st < p ? st : 2 * p - 1 - st;  // ZB-V's V, and its mirror
        for (int mb = 0; mb < m; ++mb) {
          EXPECT_EQ(s.rank_of(st, mb), mb < m / 2 ? down : p - 1 - down);
        }
        EXPECT_EQ(s.replicas_of(st).size(), 2u);
      }
      for (int r = 0; r < p; ++r) {
        std::vector<int> held = {r, p - 1 - r, p + r, 2 * p - 1 - r};
        std::sort(held.begin(), held.end());
        EXPECT_EQ(s.stages_of(r), held);
      }
      expect_replicated_schedule_runs_each_pair_once(s);
    }
  }
  // A direction alone is ZB-V's order on M/2 with its I's as B's: each rank's actions of the down
  // microbatches come in that order.
  const Schedule v = make_zb_v(4, 4), s = make_schedule({"bitpipe", 4, 8});
  for (int r = 0; r < 4; ++r) {
    std::vector<Action> down, expected;
    for (const Action& a : s.actions[r]) {
      if (a.microbatch < 4) down.push_back(a);
    }
    for (const Action& a : v.actions[r]) {
      if (a.op != Op::W) expected.emplace_back(a.op == Op::I ? Op::B : a.op, a.stage, a.microbatch);
    }
    EXPECT_EQ(down, expected) << "rank " << r;
  }
  expect_user_error({"bitpipe", 3, 6}, "needs an even number of ranks");
  expect_user_error({"bitpipe", 4, 5}, "needs an even number of microbatches");
  expect_user_error({"bitpipe", 4, 8, 3}, "got chunks=3");
}

TEST(Generators, ChimeraAndGemsOrdersAreTheDocumentedOnes) {
  EXPECT_EQ(to_csv(make_chimera(4, 4)),
            "0F0,0F1,3F2,3B2,3F3,3B3,0B0,0B1\n"
            "1F0,2F2,1F1,2F3,2B2,1B0,2B3,1B1\n"
            "1F2,2F0,1F3,2F1,2B0,1B2,2B1,1B3\n"
            "0F2,0F3,3F0,3B0,3F1,3B1,0B2,0B3\n");
  // Two units: the second runs down microbatches 2, 3 and up 6, 7 in the first's order.
  const Schedule two = make_chimera(4, 8);
  std::string second_unit;
  for (size_t i = 8; i < two.actions[1].size(); ++i) {
    second_unit += (i > 8 ? "," : "") + to_string(two.actions[1][i]);
  }
  EXPECT_EQ(second_unit, "1F2,2F6,1F3,2F7,2B6,1B2,2B7,1B3");
  EXPECT_EQ(to_csv(make_gems(4, 4)),
            "0F0,3F2,3B2,0B0,0F1,3F3,3B3,0B1\n"
            "1F0,2F2,2B2,1B0,1F1,2F3,2B3,1B1\n"
            "1F2,2F0,2B0,1B2,1F3,2F1,2B1,1B3\n"
            "0F2,3F0,3B0,0B2,0F3,3F1,3B1,0B3\n");
}

TEST(Generators, RoundRobinRoutesMicrobatchIToReplicaIModR) {
  const Schedule s = make_1f1b_rr({3, 1}, 6);
  EXPECT_EQ(s.name, "1f1b-rr");
  EXPECT_EQ(s.num_ranks, 4);
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 3}));
  EXPECT_EQ(s.placement, (std::vector<std::vector<int>>{{0, 1, 2, 0, 1, 2}, {3, 3, 3, 3, 3, 3}}));
  EXPECT_EQ(s.replicas_of(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.replicas_of(1), (std::vector<int>{3}));
  EXPECT_EQ(s.stages_of(2), (std::vector<int>{0}));
  EXPECT_EQ(s.stages_of(3), (std::vector<int>{1}));
  // Replica 0 of stage 0 runs microbatches 0 and 3 with ceil(4/3) - 1 = 1 warm-up forward.
  EXPECT_EQ(to_csv(s).substr(0, to_csv(s).find('\n')), "0F0,0F3,0B0,0B3");
  for (const std::vector<int>& replicas : std::vector<std::vector<int>>{
           {3, 1}, {1, 3}, {2, 2}, {1, 2, 1}, {3, 2, 1}, {2, 1, 2}, {1, 1, 1, 1}, {4, 1}}) {
    int most = 0;
    for (int r : replicas) most = std::max(most, r);
    for (int m : {most, most + 1, 8, 13}) {
      SCOPED_TRACE("replicas size " + std::to_string(replicas.size()) + " M=" + std::to_string(m));
      const Schedule rr = make_1f1b_rr(replicas, m);
      for (int st = 0; st < rr.num_stages; ++st) {
        for (int mb = 0; mb < m; ++mb) {
          EXPECT_EQ(rr.rank_of(st, mb), rr.stage_to_rank[st] + mb % replicas[st]);
        }
      }
      expect_replicated_schedule_runs_each_pair_once(rr);
    }
  }
  // One replica per stage: 1F1B's order.
  EXPECT_EQ(make_1f1b_rr({1, 1, 1, 1}, 7).actions, make_1f1b(4, 7).actions);
}

TEST(Generators, ReplicatedScheduleOptionsAreUserErrors) {
  expect_user_error({"chimera", 3, 6}, "needs an even number of ranks");
  expect_user_error({"chimera", 4, 6}, "multiple of 4");
  expect_user_error({"gems", 5, 4}, "got 5");
  expect_user_error({"gems", 4, 3}, "multiple of 2");
  expect_user_error({"chimera", 4, 4, 2}, "got chunks=2");
  EXPECT_THROW(make_1f1b_rr({}, 4), UserError);
  EXPECT_THROW(make_1f1b_rr({2, 0}, 4), UserError);
  try {
    make_1f1b_rr({3, 1}, 2);
    ADD_FAILURE() << "no error for 2 microbatches on 3 replicas";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("(3)"), std::string::npos) << e.what();
  }
}

TEST(Generators, BadOptionsAreUserErrors) {
  expect_user_error({"pipedream-2bw", 2, 2}, "unknown schedule 'pipedream-2bw'");
  expect_user_error({"", 2, 2}, "expected one of: gpipe, 1f1b");
  for (const auto& name : schedule_names()) {
    expect_user_error({name, 0, 4}, "ranks must be >= 1, got 0");
    expect_user_error({name, -3, 4}, "got -3");
    expect_user_error({name, 2, 0}, "microbatches must be >= 1, got 0");
    expect_user_error({name, 2, 4, -1}, "chunks must be >= 0");
  }
  expect_user_error({"1f1b", 2, 4, 2}, "got chunks=2");
  expect_user_error({"gpipe", 2, 4, 3}, "got chunks=3");
  expect_user_error({"zb-h1", 2, 4, 2}, "got chunks=2");
  expect_user_error({"zb-v", 2, 4, 3}, "runs 2 chunk(s) per rank, got chunks=3");
  expect_user_error({"zb-v", 2, 4, 1}, "got chunks=1");
  expect_user_error({"interleaved-1f1b", 2, 4, 1}, "needs chunks >= 2");
  expect_user_error({"dualpipev", 3, 5}, "(2 x ranks = 6), got microbatches=5");
  expect_user_error({"interleaved-1f1b", 4, 6}, "multiple of ranks");
  expect_user_error({"interleaved-1f1b", 4, 5}, "microbatches=5 with ranks=4");
  expect_user_error({"1f1b", 100000, 1000}, "more than the 1024 ranks");
  expect_user_error({"interleaved-1f1b", 2, 2, 1000000000}, "stage-microbatches, more than");
  // Explicit defaults are accepted.
  EXPECT_NO_THROW(make_schedule({"1f1b", 2, 4, 1}));
  EXPECT_NO_THROW(make_schedule({"zb-v", 2, 4, 2}));
  EXPECT_NO_THROW(make_schedule({"interleaved-1f1b", 2, 4, 4}));
}

// Fewer microbatches than ranks: one group of M through the chunks. Rank 0 of P = 4, V = 2,
// M = 2 warms up with (V - 1) M + 2 (P - 1) = 8 forwards, all four of its own: every forward
// first, then the backwards, the last chunk's first.
TEST(Generators, InterleavedWithFewerMicrobatchesThanRanksIsOneGroup) {
  const Schedule s = make_schedule({"interleaved-1f1b", 4, 2, 2});
  const std::vector<Action> rank0 = {Action::make(Op::F, 0, 0), Action::make(Op::F, 0, 1),
                                     Action::make(Op::F, 4, 0), Action::make(Op::F, 4, 1),
                                     Action::make(Op::B, 4, 0), Action::make(Op::B, 4, 1),
                                     Action::make(Op::B, 0, 0), Action::make(Op::B, 0, 1)};
  EXPECT_EQ(s.actions[0], rank0);
  // Rank 3 warms up with (V - 1) M = 2: its first chunk's forwards, then alternates.
  const std::vector<Action> rank3 = {Action::make(Op::F, 3, 0), Action::make(Op::F, 3, 1),
                                     Action::make(Op::F, 7, 0), Action::make(Op::B, 7, 0),
                                     Action::make(Op::F, 7, 1), Action::make(Op::B, 7, 1),
                                     Action::make(Op::B, 3, 0), Action::make(Op::B, 3, 1)};
  EXPECT_EQ(s.actions[3], rank3);
  EXPECT_NO_THROW(validate(s));
}

}  // namespace
}  // namespace pptrain
