// The simulator against closed forms: bubbles, peak activation memory and weight versions of
// every generator, a hand-timed GPipe with communication latency, data-parallel reductions
// beside the cool-down, and errors for schedules that cannot run.
#include "pptrain/sim/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

constexpr double kEps = 1e-9;
const std::vector<int> kRanks = {1, 2, 3, 4, 8};

CostModel costs(double f, double i, double w, double comm = 0) {
  CostModel c;
  c.forward = f;
  c.backward_input = i;
  c.backward_weight = w;
  c.comm = comm;
  return c;
}

// The same cost model counting activations only until I (r = 0: W keeps nothing): the figure
// the closed forms of generators.h give.
CostModel until_i(CostModel c) {
  c.mem_w_ratio = 0;
  return c;
}

// Idle time of each rank within the longest span: cost - busy[r].
std::vector<double> bubble_times(const SimResult& r) {
  std::vector<double> out;
  for (const auto& rank : r.ranks) out.push_back(r.cost - rank.busy);
  return out;
}

SimResult run(const std::string& name, int p, int m, const CostModel& c, int chunks = 0) {
  return simulate(validate(make_schedule({name, p, m, chunks})), c);
}

// Every compute event starts after the events it depends on have ended (+ comm across ranks),
// ranks never run two things at once, and each (stage, microbatch) has one F and one backward.
void expect_dependencies_respected(const Schedule& s, const SimResult& r, double comm) {
  // A composite's parts all take its start and end.
  std::map<std::tuple<Op, int, int>, const TimelineEvent*> by_key;
  size_t weights = 0;
  for (const auto& e : r.timeline.events) {
    if (!is_compute(e.action.op)) continue;
    for (const Action& a : atoms_of(e.action)) {
      by_key[{a.op == Op::B ? Op::I : a.op, a.stage, a.microbatch}] = &e;
      weights += a.op == Op::W;
    }
  }
  // One F and one I or B per (stage, microbatch), and a W for each I.
  ASSERT_EQ(by_key.size(), 2u * s.num_stages * s.num_microbatches + weights);
  if (s.has_split_backward() && s.name != "dualpipev") {
    ASSERT_EQ(weights, 1u * s.num_stages * s.num_microbatches);
  }
  const auto after = [&](const TimelineEvent& e, Op op, int stage, int mb) {
    const TimelineEvent* dep = by_key.at({op, stage, mb});
    const double gap = dep->rank == e.rank ? 0 : comm;
    EXPECT_GE(e.start + kEps, dep->end + gap)
        << to_string(e.action) << " vs " << to_string(dep->action);
  };
  for (const auto& [key, e] : by_key) {
    const auto [op, stage, mb] = key;
    if (op == Op::F && stage > 0) after(*e, Op::F, stage - 1, mb);
    if (op == Op::I) {
      after(*e, Op::F, stage, mb);
      if (stage + 1 < s.num_stages) after(*e, Op::I, stage + 1, mb);
    }
    if (op == Op::W) after(*e, Op::I, stage, mb);
  }
  std::vector<std::vector<std::pair<double, double>>> spans(s.num_ranks);
  for (const auto& e : r.timeline.events) spans[e.rank].emplace_back(e.start, e.end);
  for (auto& list : spans) {
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i) EXPECT_GE(list[i].first + kEps, list[i - 1].second);
  }
}

TEST(CostModel, Parse) {
  const CostModel c = CostModel::parse("F=2, W=0.5,comm=0.1,I=1.5");
  EXPECT_EQ(c.forward, 2);
  EXPECT_EQ(c.backward_input, 1.5);
  EXPECT_EQ(c.backward_weight, 0.5);
  EXPECT_EQ(c.comm, 0.1);
  const CostModel d = CostModel::parse("I=3");
  EXPECT_EQ(d.forward, 1);
  EXPECT_EQ(d.backward_input, 3);
  EXPECT_EQ(CostModel::parse("").to_string(), "F=1,I=1,W=1,comm=0");
  EXPECT_EQ(CostModel::parse(d.to_string()).backward_input, 3);
  for (const char* bad : {"F", "F=", "F=x", "F=1x", "F=-1", "F=inf", "B=2", "f=1", "F=1;I=2"}) {
    EXPECT_THROW(CostModel::parse(bad), UserError) << bad;
  }
  // One value per stage for F, I and W: a 2-stage GPipe of one microbatch takes stage 0's F,
  // stage 1's F and backward (I + W), then stage 0's backward.
  const CostModel stages = CostModel::parse("F=1:3,I=2 : 4,W=0.5:0,comm=0");
  EXPECT_EQ(stages.stage_forward, (std::vector<double>{1, 3}));
  EXPECT_EQ(stages.stage_backward_input, (std::vector<double>{2, 4}));
  EXPECT_EQ(stages.stage_backward_weight, (std::vector<double>{0.5, 0}));
  EXPECT_DOUBLE_EQ(run("gpipe", 2, 1, stages).makespan, 1 + 3 + 4 + 0 + 2 + 0.5);
  EXPECT_THROW(run("gpipe", 4, 1, stages), UserError);  // 2 values, 4 stages
  for (const char* bad : {"F=1:", "F=:1", "F=1::2", "F=1:x", "F=1:-2", "comm=1:2"}) {
    EXPECT_THROW(CostModel::parse(bad), UserError) << bad;
  }
  try {
    CostModel::parse("F=1,X=2");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'X'"), std::string::npos) << e.what();
  }
}

TEST(CostModel, ParseWeights) {
  const CostModel c = CostModel::parse("F=1,I=1,W=1,comm=0,weights=4");
  EXPECT_EQ(c.weights, 4);
  EXPECT_TRUE(c.counts_weights());
  EXPECT_EQ(c.to_string(), "F=1,I=1,W=1,comm=0,weights=4");
  EXPECT_EQ(CostModel::parse(c.to_string()).weights, 4);
  // Not counted by default, and then not printed.
  EXPECT_EQ(CostModel::parse("F=2").weights, 0);
  EXPECT_FALSE(CostModel::parse("F=2,weights=0").counts_weights());
  EXPECT_EQ(CostModel::parse("F=2,weights=0").to_string(), "F=2,I=1,W=1,comm=0");
  // Each error is one line naming the bad piece.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"weights=-1", "value of weights must be a finite number >= 0, got '-1'"},
      {"weights=inf", "got 'inf'"},
      {"weights=nan", "got 'nan'"},
      {"weights=x", "got 'x'"},
      {"weights=", "got ''"},
      {"weights=2GB", "got '2GB'"},
      {"Weights=1", "unknown key 'Weights'"},
  };
  for (const auto& [piece, expected] : bad) {
    try {
      CostModel::parse("F=1," + piece);
      ADD_FAILURE() << piece << " was accepted";
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

TEST(CostModel, WeightsSplitOverChunksAndStageWeightsOverride) {
  CostModel c;
  EXPECT_DOUBLE_EQ(c.weight_memory(1, 4, 2), 0);
  c.weights = 4;
  EXPECT_DOUBLE_EQ(c.weight_memory(1, 4, 2), 2);  // V = 2: a chunk holds half the share
  EXPECT_DOUBLE_EQ(c.weight_memory(0, 2, 2), 4);
  c.stage_weights = {3, 5};
  EXPECT_DOUBLE_EQ(c.weight_memory(1, 2, 2), 5);
  EXPECT_THROW(c.weight_memory(1, 4, 2), UserError);
  CostModel only_stages;
  only_stages.stage_weights = {1, 1};
  EXPECT_TRUE(only_stages.counts_weights());
}

TEST(CostModel, ChunksSplitTheShareAndStageVectorsOverride) {
  CostModel c = costs(1, 2, 1);
  EXPECT_DOUBLE_EQ(c.time(Action::make(Op::F, 3, 0), 8, 4), 0.5);
  EXPECT_DOUBLE_EQ(c.time(Action::make(Op::B, 3, 0), 8, 4), 1.5);
  EXPECT_DOUBLE_EQ(c.time(Action::make(Op::SEND_F, 3, 0), 8, 4), 0);
  const Action overlap = Action::overlap({Action::make(Op::F, 1, 1), Action::make(Op::I, 1, 0)});
  EXPECT_DOUBLE_EQ(c.time(overlap, 2, 2), 3);
  c.stage_forward = {5, 7};
  EXPECT_DOUBLE_EQ(c.time(Action::make(Op::F, 1, 0), 2, 2), 7);
  EXPECT_THROW(c.time(Action::make(Op::F, 1, 0), 4, 2), UserError);
  EXPECT_DOUBLE_EQ(c.activation(1, 4, 2), 0.5);
  c.stage_activation = {3, 4};
  EXPECT_DOUBLE_EQ(c.activation(1, 2, 2), 4);
}

TEST(Simulator, GpipeAndOneFOneBBubbleRatio) {
  for (const char* name : {"gpipe", "1f1b"}) {
    for (int p : kRanks) {
      for (int m : {1, 2, p, 2 * p + 1, 4 * p}) {
        SCOPED_TRACE(std::string(name) + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        const SimResult r = run(name, p, m, costs(1, 1, 1));
        EXPECT_NEAR(r.bubble_ratio, double(p - 1) / (m + p - 1), kEps);
        EXPECT_NEAR(r.makespan, 3.0 * (m + p - 1), kEps);
        for (const auto& rank : r.ranks) {
          EXPECT_NEAR(rank.busy, 3.0 * m, kEps);
          EXPECT_NEAR(rank.idle, r.makespan - rank.busy, kEps);
          const double peak = std::string(name) == "gpipe" ? m : std::min(p - rank.rank, m);
          EXPECT_NEAR(rank.peak_activations, peak, kEps) << "rank " << rank.rank;
        }
      }
    }
  }
}

TEST(Simulator, InterleavedBubbleIsOneVthOfOneFOneB) {
  for (int p : kRanks) {
    for (int v : {2, 3, 4}) {
      for (int m : {p, 2 * p, 3 * p}) {
        for (const CostModel& c : {costs(1, 1, 1), costs(1, 2, 1), costs(2, 0.5, 0.5)}) {
          SCOPED_TRACE("P=" + std::to_string(p) + " V=" + std::to_string(v) +
                       " M=" + std::to_string(m) + " " + c.to_string());
          const SimResult plain = run("1f1b", p, m, c);
          const SimResult inter = run("interleaved-1f1b", p, m, c, v);
          const double expected = (p - 1) * (c.forward + c.backward_input + c.backward_weight) / v;
          for (int r = 0; r < p; ++r) {
            EXPECT_NEAR(bubble_times(plain)[r], v * expected, kEps);
            EXPECT_NEAR(bubble_times(inter)[r], expected, kEps);
            // Megatron's warm-up: (V-1)P + 2(P-1-r) forwards, then one more before the first B.
            const double peak = std::min(m * v, (v - 1) * p + 2 * (p - 1 - r) + 1) / double(v);
            EXPECT_NEAR(inter.ranks[r].peak_activations, peak, kEps) << "rank " << r;
          }
        }
      }
    }
  }
}

// F, I, W triples where the zero-bubble formulas apply (F + I >= 2W).
const std::vector<CostModel> kZeroBubbleCosts = {costs(1, 1, 1), costs(1, 2, 1), costs(2, 1.5, 0.5),
                                                 costs(1, 1, 0.25), costs(3, 1, 1)};

TEST(Simulator, ZbH1BubbleAndMemory) {
  // Holds for M >= P: the deferred W's need a full pipeline of microbatches to fill the tail.
  for (int p : kRanks) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 2}) {
      for (const CostModel& c : kZeroBubbleCosts) {
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " " + c.to_string());
        const SimResult r = run("zb-h1", p, m, c);
        const double expected = (p - 1) * (c.forward + c.backward_input - c.backward_weight);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(bubble_times(r)[rank], expected, kEps) << "rank " << rank;
          // Until I: 1F1B's P - r. With r = 0.5 (the default) the r W's rank r holds back keep
          // half a unit each, P - r/2, so rank 0's P is the peak: the paper's ZB-1p memory.
          EXPECT_NEAR(run("zb-h1", p, m, until_i(c)).ranks[rank].peak_activations,
                      std::min(p - rank, m), kEps);
          EXPECT_NEAR(r.ranks[rank].peak_activations, p - 0.5 * rank, kEps);
        }
      }
    }
  }
}

TEST(Simulator, ZbH2BubbleAndMemory) {
  // Holds for M >= 2P - 1: the warm-up of 2(P-1) forwards on rank 0 needs that many microbatches.
  for (int p : kRanks) {
    for (int m : {2 * p - 1, 2 * p, 3 * p + 1}) {
      for (const CostModel& c : kZeroBubbleCosts) {
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " " + c.to_string());
        const SimResult r = run("zb-h2", p, m, c);
        const double expected = (p - 1) * (c.forward + c.backward_input - 2 * c.backward_weight);
        const SimResult only = run("zb-h2", p, m, until_i(c));
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(bubble_times(r)[rank], expected, kEps) << "rank " << rank;
          EXPECT_NEAR(only.ranks[rank].peak_activations, std::min(2 * p - 2 * rank - 1, m), kEps);
          // 2r held-back W's keep half a unit each: 2P - 1 - r, at most 2P (ZB-2p) on rank 0.
          EXPECT_NEAR(r.ranks[rank].peak_activations, 2 * p - 1 - rank, kEps);
        }
      }
    }
  }
  // With few microbatches the peak bound still holds.
  for (int p : kRanks) {
    for (int m = 1; m <= 2 * p; ++m) {
      const SimResult r = run("zb-h2", p, m, until_i(costs(1, 1, 1)));
      const SimResult half = run("zb-h2", p, m, costs(1, 1, 1));
      for (int rank = 0; rank < p; ++rank) {
        EXPECT_LE(r.ranks[rank].peak_activations, std::min(2 * p - 2 * rank - 1, m) + kEps);
        EXPECT_LE(half.ranks[rank].peak_activations, 2 * p - 1 + kEps);
      }
    }
  }
}

// Counted until I (r = 0). ZB-V's order lets up to 2P W's wait, so with the default r = 0.5 it
// holds more: 5.75 units at P = 4, 11.75 at P = 8 (below ZB-2p's 2P).
TEST(Simulator, ZbVHasNoBubbleWhenFEqualsIEqualsW) {
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 5 * p + 3}) {
      SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
      const SimResult r = run("zb-v", p, m, until_i(costs(2, 2, 2)));
      EXPECT_LE(run("zb-v", p, m, costs(2, 2, 2)).ranks[0].peak_activations, 2 * p + kEps);
      EXPECT_NEAR(r.bubble_ratio, 0, kEps);
      EXPECT_NEAR(r.cost, 6.0 * m, kEps);
      for (const auto& rank : r.ranks) {
        EXPECT_LE(rank.peak_activations, std::min(p, m) + kEps) << "rank " << rank.rank;
      }
    }
  }
  for (int p : kRanks) {
    for (int m = 1; m < 2 * p; ++m) {
      const SimResult r = run("zb-v", p, m, until_i(costs(1, 1, 1)));
      for (const auto& rank : r.ranks) EXPECT_LE(rank.peak_activations, std::min(p, m) + kEps);
    }
  }
}

TEST(Simulator, ZbVWithUnequalCostsBeatsOneFOneBAndDoesNotGrowWithM) {
  // The order is built for F = I = W; other costs leave a bubble, but a fixed one: it must not
  // grow with M (the order keeps slack between each F and its I) and stays below 1F1B's.
  for (int p : {2, 4, 8}) {
    for (const CostModel& c : kZeroBubbleCosts) {
      SCOPED_TRACE("P=" + std::to_string(p) + " " + c.to_string());
      const double at_3p = run("zb-v", p, 3 * p, c).cost -
                           3 * p * (c.forward + c.backward_input + c.backward_weight);
      const double at_6p = run("zb-v", p, 6 * p, c).cost -
                           6 * p * (c.forward + c.backward_input + c.backward_weight);
      EXPECT_NEAR(at_3p, at_6p, kEps);
      const SimResult one = run("1f1b", p, 6 * p, c);
      EXPECT_LT(at_6p, bubble_times(one)[0] + kEps);
    }
  }
}

// V-Half and V-Min (generators.h): at F = I = W = T every rank's bubble is the closed form, and
// the peak is (P+2)/2 and (P+4)/3 microbatches of the rank's share in the simulator's unit, the
// unit in which 1F1B's and ZB-V's peak is P. Counted as the paper counts (a stash lives until its
// W: stage_weight_stash = the chunk's activation, 1/2) the largest rank's peak is exactly that;
// the default count (freed at the end of I) never exceeds it.
double v_bubble(const std::string& name, int p, double t) {
  if (p == 1) return 0;
  if (name == "v-half") return (p % 2 == 0 ? 7 * p - 4 : 7 * (p - 1)) * t / 4;
  return (p % 3 == 0 ? 4 * p - 3 : 4 * p - 5) * t / 2;
}

TEST(Simulator, ControllableMemoryVsBubbleAndPeak) {
  for (const std::string name : {"v-half", "v-min"}) {
    for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12}) {
      const double target = name == "v-half" ? (p + 2) / 2 : (p + 4) / 3;
      for (int m : {p, p + 1, 2 * p, 3 * p + 1, 8 * p}) {
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        const double t = 2;
        const SimResult r = run(name, p, m, costs(t, t, t));
        CostModel until_w = costs(t, t, t);
        until_w.stage_weight_stash.assign(2 * p, 0.5);
        const SimResult w = run(name, p, m, until_w);
        double most = 0, most_until_w = 0;
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(bubble_times(r)[rank], v_bubble(name, p, t), kEps) << "rank " << rank;
          most = std::max(most, r.ranks[rank].peak_activations);
          most_until_w = std::max(most_until_w, w.ranks[rank].peak_activations);
        }
        EXPECT_NEAR(most_until_w, target, kEps);
        if (name == "v-half") {
          EXPECT_NEAR(most, target, kEps);
        }
        EXPECT_LE(most, target + kEps);
        // The bubble ratio against the paper's approximations, P/2M and 2P/3M.
        const double paper = name == "v-half" ? p / (2.0 * m) : 2.0 * p / (3.0 * m);
        EXPECT_LE(r.bubble_ratio, 1.2 * paper + kEps);
        // Below 1F1B's bubble, and 1F1B's peak is P.
        if (p > 1) {
          EXPECT_LT(r.bubble_ratio, run("1f1b", p, m, costs(t, t, t)).bubble_ratio);
        }
      }
      for (int m = 1; m < p; ++m) {
        for (const RankStats& rank : run(name, p, m, costs(1, 1, 1)).ranks) {
          EXPECT_LE(rank.peak_activations, target + kEps) << name << " P=" << p << " M=" << m;
        }
      }
    }
  }
}

// Within the paper's condition (2F <= 2I + W, 2I <= 2F + W) V-Half's bubble does not grow with
// M; V-Min's block has no slack, so unequal costs make its bubble grow.
TEST(Simulator, ControllableMemoryVsWithUnequalCosts) {
  for (int p : {2, 4, 8}) {
    const auto bubble = [&](const std::string& name, int m, const CostModel& c) {
      return run(name, p, m, c).cost - m * (c.forward + c.backward_input + c.backward_weight);
    };
    const CostModel within = costs(1, 1, 0.25), outside = costs(1, 2, 1);
    EXPECT_NEAR(bubble("v-half", 3 * p, within), bubble("v-half", 6 * p, within), kEps) << p;
    EXPECT_GT(bubble("v-min", 6 * p, within), bubble("v-min", 3 * p, within) + kEps) << p;
    EXPECT_GT(bubble("v-half", 6 * p, outside), bubble("v-half", 3 * p, outside) + kEps) << p;
  }
}

// DualPipeV (generators.h) at F = I = W = T: (P-1)T of bubble and P + 1/2 microbatches of
// activations on every rank, whatever M >= 2P. The simulator runs an OVERLAP_F_B's parts one
// after the other, so this is DualPipeV without the overlap it is named for.
TEST(Simulator, DualPipeVBubbleAndPeak) {
  for (int p : {1, 2, 3, 4, 5, 6, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 6 * p + 1}) {
      SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
      const double t = 2;
      const SimResult r = run("dualpipev", p, m, costs(t, t, t));
      for (int rank = 0; rank < p; ++rank) {
        EXPECT_NEAR(bubble_times(r)[rank], (p - 1) * t, kEps) << "rank " << rank;
        EXPECT_NEAR(r.ranks[rank].peak_activations, p + 0.5, kEps) << "rank " << rank;
      }
    }
  }
}

TEST(Simulator, EveryGeneratorRespectsDependenciesUnderUnequalCosts) {
  for (const auto& name : schedule_names()) {
    for (int p : kRanks) {
      for (int m : {1, p, 2 * p + 1}) {
        if (name == "interleaved-1f1b" && m % p) continue;
        if (name == "dualpipev" && m < 2 * p) continue;
        const bool bidirectional = name == "chimera" || name == "gems" || name == "bitpipe";
        if (bidirectional && (p % 2 || m % (name == "chimera" ? p : 2))) continue;
        for (const CostModel& c :
             {costs(1, 2, 1, 0), costs(2, 1.5, 0.5, 0.3), costs(1, 0.1, 3, 1)}) {
          SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m) + " " +
                       c.to_string());
          const Schedule s = make_schedule({name, p, m});
          const SimResult r = simulate(validate(s), c);
          expect_dependencies_respected(s, r, c.comm);
          double busy = 0;
          for (const auto& rank : r.ranks) busy += rank.busy;
          const double per_mb = c.forward + c.backward_input + c.backward_weight;
          EXPECT_NEAR(busy, p * m * per_mb, 1e-6);
          EXPECT_GE(r.makespan + kEps, m * per_mb);
        }
      }
    }
  }
}

// zb-auto against the hand-written zero-bubble schedules, under the same costs: at a limit of P
// (ZB-1p) its bubble is no worse than ZB-H1's, at 2P (ZB-2p) no worse than ZB-H2's, and it keeps
// the limit. Settings: the self-tests of the authors' auto_schedule.py (P, M, F, B = I, W, comm;
// docs/REFERENCES 4.2) and GPT-like ratios (W about half of I, comm a few percent of F).
struct ZbSetting {
  int p, m;
  double f, i, w, comm;
};
const std::vector<ZbSetting> kZbSettings = {
    {4, 12, 5, 6, 4, 0},       {4, 12, 5478, 5806, 3534, 200}, {32, 16, 1, 1, 1, 0},
    {8, 24, 1, 1, 1, 0},       {8, 32, 1, 2, 1, 0.1},          {16, 48, 3, 1, 1, 0.5},
    {8, 24, 18, 18, 9, 0.6},   {8, 32, 29, 28, 15, 0.9},       {16, 48, 26, 25, 13, 1.1},
    {16, 64, 45, 43, 22, 0.9}, {32, 64, 3, 3, 1.5, 0.2},       {4, 4, 1, 2, 0.5, 0.2},
};

TEST(ZbAuto, NoWorseThanZbH1AtLimitPAndZbH2AtTwoP) {
  for (const ZbSetting& z : kZbSettings) {
    const CostModel c = costs(z.f, z.i, z.w, z.comm);
    SCOPED_TRACE("P=" + std::to_string(z.p) + " M=" + std::to_string(z.m) + " " + c.to_string());
    for (int times : {1, 2}) {
      ScheduleOptions o{"zb-auto", z.p, z.m};
      o.costs = c.stage_costs(z.p, z.p);
      o.memory_limit = times * z.p;
      const SimResult autos = simulate(validate(make_schedule(o)), c);
      const SimResult hand = run(times == 1 ? "zb-h1" : "zb-h2", z.p, z.m, c);
      EXPECT_LE(autos.bubble_ratio, hand.bubble_ratio + 0.002) << "limit " << o.memory_limit;
      for (const RankStats& r : autos.ranks) EXPECT_LE(r.peak_activations, o.memory_limit + kEps);
    }
  }
}

// The same comparison on random costs: F and I in [0.5, 3], W in [0.2, 2], comm 0, 0.1 or 0.2.
TEST(ZbAuto, NoWorseThanTheHandWrittenOnesOnRandomCosts) {
  std::mt19937 rng(10241);
  std::uniform_real_distribution<double> time(0.5, 3), weight(0.2, 2);
  int compared = 0;
  for (int p : {2, 3, 4, 6, 8, 12}) {
    for (int m : {p, 2 * p, 3 * p}) {
      for (int trial = 0; trial < 3; ++trial) {
        const CostModel c = costs(time(rng), time(rng), weight(rng), 0.1 * (trial % 3));
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " " + c.to_string());
        for (int times : {1, 2}) {
          const SimResult hand = run(times == 1 ? "zb-h1" : "zb-h2", p, m, c);
          double peak = 0;
          for (const RankStats& r : hand.ranks) peak = std::max(peak, r.peak_activations);
          if (peak > times * p) continue;  // the hand-written one does not fit the limit
          ScheduleOptions o{"zb-auto", p, m};
          o.costs = c.stage_costs(p, p);
          o.memory_limit = times * p;
          EXPECT_LE(simulate(validate(make_schedule(o)), c).bubble_ratio, hand.bubble_ratio + 0.002)
              << "limit " << o.memory_limit;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 6 * 3 * 3 * 2);
}

TEST(ZbAuto, SimulatedPeakKeepsTheLimitWithPerStageCosts) {
  std::mt19937 rng(2401);
  std::uniform_real_distribution<double> time(0.1, 4), share(0, 1);
  for (int p : {2, 3, 5, 8}) {
    for (int m : {1, p - 1, p, 3 * p + 1}) {
      if (m < 1) continue;
      for (int trial = 0; trial < 4; ++trial) {
        CostModel c = costs(1, 1, 1, share(rng));
        c.mem_w_ratio = share(rng);
        for (int s = 0; s < p; ++s) {
          c.stage_forward.push_back(time(rng));
          c.stage_backward_input.push_back(time(rng));
          c.stage_backward_weight.push_back(time(rng));
          if (trial % 2) c.stage_activation.push_back(0.5 + share(rng));
        }
        const double smallest = smallest_memory_limit(c.stage_costs(p, p));
        for (double limit : {smallest, 0.5 * p + smallest, 1.0 * p + 1, 2.0 * p + 1}) {
          SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " trial " +
                       std::to_string(trial) + " limit " + std::to_string(limit));
          ScheduleOptions o{"zb-auto", p, m};
          o.costs = c.stage_costs(p, p);
          o.memory_limit = limit;
          double predicted = 0;
          const Schedule s = make_zb_auto({p, m, o.costs, limit}, &predicted);
          EXPECT_EQ(s, make_schedule(o));
          const SimResult r = simulate(validate(s), c);
          // The greedy times its candidates by the simulator's rules.
          EXPECT_NEAR(predicted, r.cost, 1e-9 * std::max(1.0, r.cost));
          expect_dependencies_respected(s, r, c.comm);
          for (const RankStats& rank : r.ranks) EXPECT_LE(rank.peak_activations, limit + 1e-9);
          EXPECT_NO_THROW(check_peak_within_limit(r, limit, s.name));
        }
      }
    }
  }
}

// --solver ilp: the span it reports is what the simulator measures, never above the greedy's,
// and its schedule keeps the limit when timed.
TEST(ZbIlp, SimulatedCostIsTheReportedSpanAndKeepsTheLimit) {
  std::mt19937 rng(4202);
  std::uniform_real_distribution<double> time(0.3, 3), share(0, 1);
  for (int trial = 0; trial < 6; ++trial) {
    const int p = 2 + trial % 3, m = 3 + trial % 3;
    CostModel c = costs(1, 1, 1, 0.5 * share(rng));
    c.mem_w_ratio = share(rng);
    for (int s = 0; s < p; ++s) {
      c.stage_forward.push_back(time(rng));
      c.stage_backward_input.push_back(time(rng));
      c.stage_backward_weight.push_back(time(rng));
    }
    const double limit = trial % 2 ? 0 : 1.5 + share(rng) * p;
    SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " limit " +
                 std::to_string(limit));
    ScheduleOptions o{"zb-auto", p, m};
    o.costs = c.stage_costs(p, p);
    o.memory_limit = limit;
    const SimResult greedy = simulate(validate(make_schedule(o)), c);
    IlpReport report;
    o.solver = ScheduleSolver::kIlp;
    o.time_limit_s = 10;
    o.ilp_report = &report;
    const SimResult ilp = simulate(validate(make_schedule(o)), c);
    EXPECT_NEAR(ilp.cost, report.objective, 1e-9 * std::max(1.0, ilp.cost));
    EXPECT_NEAR(greedy.cost, report.heuristic, 1e-9 * std::max(1.0, greedy.cost));
    EXPECT_LE(ilp.cost, greedy.cost + 1e-9);
    EXPECT_NO_THROW(check_peak_within_limit(ilp, limit, "zb-auto"));
  }
}

TEST(Simulator, CommLatencyDelaysGpipeByHand) {
  // P=2, M=2, F=1, B=I+W=2, comm=c:
  //   rank 1: F0 [1+c, 2+c], F1 [2+c, 3+c], B0 [3+c, 5+c], B1 [5+c, 7+c]
  //   rank 0: F0 [0, 1], F1 [1, 2], B0 [5+2c, 7+2c], B1 [7+2c, 9+2c]
  for (double c : {0.0, 0.25, 1.5}) {
    const SimResult r = run("gpipe", 2, 2, costs(1, 1, 1, c));
    EXPECT_NEAR(r.makespan, 9 + 2 * c, kEps);
    EXPECT_NEAR(r.cost, 9 + 2 * c, kEps);
    EXPECT_NEAR(r.ranks[0].busy, 6, kEps);
    EXPECT_NEAR(r.ranks[1].idle, 9 + 2 * c - 6, kEps);
    EXPECT_NEAR(r.bubble_ratio, 1 - 12 / (2 * (9 + 2 * c)), kEps);
    std::map<std::string, std::pair<double, double>> at;
    for (const auto& e : r.timeline.events) at[to_string(e.action)] = {e.start, e.end};
    EXPECT_NEAR(at.at("1F0").first, 1 + c, kEps);
    EXPECT_NEAR(at.at("1B1").second, 7 + c, kEps);
    EXPECT_NEAR(at.at("0B0").first, 5 + 2 * c, kEps);
    // Comm actions are in the timeline as zero-length events.
    EXPECT_NEAR(at.at("1RECV_F0").first, 1 + c, kEps);
    EXPECT_NEAR(at.at("1RECV_F0").second, 1 + c, kEps);
    EXPECT_NEAR(at.at("0SEND_F1").first, 2, kEps);
  }
}

// The overheads occupy the rank (CostModel::action_overhead, send_overhead, recv_overhead).
// GPipe, P=2, M=2, F=1, B=I+W=2, comm=0.5, action=0.1, send=0.2, recv=0.3:
//   rank 0: F0 [0, 1]; SEND_F0 [1.1, 1.3] (arrives 1.8); F1 [1.3, 2.3]; SEND_F1 [2.4, 2.6]
//           (arrives 3.1)
//   rank 1: RECV_F0 [1.8, 2.1]; F0 [2.1, 3.1]; RECV_F1 [3.2, 3.5]; F1 [3.5, 4.5]; B0 [4.6, 6.6];
//           SEND_B0 [6.7, 6.9] (arrives 7.4); B1 [6.9, 8.9]; SEND_B1 [9.0, 9.2] (arrives 9.7)
//   rank 0: RECV_B0 [7.4, 7.7]; B0 [7.7, 9.7]; RECV_B1 [9.8, 10.1]; B1 [10.1, 12.1]
TEST(Simulator, OverheadsOccupyTheRankByHand) {
  CostModel cost = CostModel::parse("F=1,I=1,W=1,comm=0.5,action=0.1,send=0.2,recv=0.3");
  EXPECT_EQ(cost.action_overhead, 0.1);
  EXPECT_EQ(cost.send_overhead, 0.2);
  EXPECT_EQ(cost.recv_overhead, 0.3);
  EXPECT_EQ(cost.to_string(), "F=1,I=1,W=1,comm=0.5,action=0.1,send=0.2,recv=0.3");
  const ValidatedSchedule gpipe = validate(make_schedule({"gpipe", 2, 2}));
  for (const double cores : {0.0, 2.0}) {
    SCOPED_TRACE(cores);
    cost.cores = cores;
    const SimResult r = simulate(gpipe, cost);
    std::map<std::string, std::pair<double, double>> at;
    for (const auto& e : r.timeline.events) at[to_string(e.action)] = {e.start, e.end};
    const std::map<std::string, std::pair<double, double>> expected = {
        {"0F0", {0, 1}},          {"0SEND_F0", {1.1, 1.3}}, {"0F1", {1.3, 2.3}},
        {"0SEND_F1", {2.4, 2.6}}, {"1RECV_F0", {1.8, 2.1}}, {"1F0", {2.1, 3.1}},
        {"1RECV_F1", {3.2, 3.5}}, {"1F1", {3.5, 4.5}},      {"1B0", {4.6, 6.6}},
        {"1SEND_B0", {6.7, 6.9}}, {"1B1", {6.9, 8.9}},      {"1SEND_B1", {9.0, 9.2}},
        {"0RECV_B0", {7.4, 7.7}}, {"0B0", {7.7, 9.7}},      {"0RECV_B1", {9.8, 10.1}},
        {"0B1", {10.1, 12.1}}};
    ASSERT_EQ(at.size(), expected.size());
    for (const auto& [action, times] : expected) {
      EXPECT_NEAR(at.at(action).first, times.first, kEps) << action;
      EXPECT_NEAR(at.at(action).second, times.second, kEps) << action;
    }
    EXPECT_NEAR(r.makespan, 12.1, kEps);
    // Busy stays the compute: 2 x (1 + 2) per rank.
    EXPECT_NEAR(r.ranks[0].busy, 6, kEps);
    EXPECT_NEAR(r.ranks[1].busy, 6, kEps);
    // The figures alone (no timeline) count them too.
    EXPECT_NEAR(simulate(gpipe, cost, VersionRule{}, Record::kFigures).makespan, 12.1, kEps);
  }
}

TEST(Simulator, ZeroOverheadsChangeNothingAndBadOnesAreRefused) {
  const ValidatedSchedule s = validate(make_schedule({"zb-v", 2, 8}));
  CostModel cost = CostModel::parse("F=1,I=1.5,W=0.7,comm=0.2");
  EXPECT_FALSE(cost.counts_overheads());
  const SimResult before = simulate(s, cost);
  cost.action_overhead = cost.send_overhead = cost.recv_overhead = 0;
  EXPECT_EQ(simulate(s, cost).makespan, before.makespan);
  cost.send_overhead = -1;
  EXPECT_THROW(
      {
        try {
          simulate(s, cost);
        } catch (const UserError& e) {
          EXPECT_NE(std::string(e.what()).find("send_overhead"), std::string::npos) << e.what();
          throw;
        }
      },
      UserError);
  EXPECT_THROW(CostModel::parse("action=-0.1"), UserError);
}

// A skip connection's message from stage 0 to stage 2 takes `skip` (CostModel::skip_comm) to
// arrive; 2F0 waits for it as for any input. GPipe on 3 ranks, M=1, F=1, comm=0.5:
//   0F0 [0, 1]; 1F0 [1.5, 2.5]; 2F0 at max(3, 1 + skip).
TEST(Simulator, ASkipMessageArrivesAfterItsOwnLatency) {
  Schedule s = parse_csv("0F0,0B0\n1F0,1B0\n2F0,2B0\n");
  s.skips = {{0, 2}};
  for (const double skip : {0.0, 1.0, 5.0}) {
    CostModel c = costs(1, 1, 1, 0.5);
    c.skip_comm = skip;
    const SimResult r = simulate(validate(s), c);
    std::map<std::string, std::pair<double, double>> at;
    for (const auto& e : r.timeline.events) at[to_string(e.action)] = {e.start, e.end};
    const double arrives = 1 + (skip > 0 ? skip : 0.5);
    EXPECT_NEAR(at.at("0SEND_F0>2").first, 1, kEps);
    EXPECT_NEAR(at.at("2RECV_F0<0").first, std::max(3.0, arrives), kEps);
    EXPECT_NEAR(at.at("2F0").first, std::max(3.0, arrives), kEps);
    // The gradient goes back the same way: 0B0 waits for 1B0's message and the skip's.
    const double b2_end = at.at("2B0").second;
    EXPECT_NEAR(at.at("0B0").first,
                std::max(at.at("1B0").second + 0.5, b2_end + (skip > 0 ? skip : 0.5)), kEps);
  }
  EXPECT_EQ(CostModel::parse("F=1,skip=3").skip_comm, 3);
  EXPECT_EQ(CostModel::parse("F=1,skip=3").to_string(), "F=1,I=1,W=1,comm=0,skip=3");
}

TEST(Simulator, TimelineHasEveryActionOfTheLoweredSchedule) {
  const Schedule s = make_schedule({"zb-v", 3, 6});
  const Schedule lowered = lower(s);
  const SimResult r = simulate(validate(s), costs(1, 1, 1, 0.1));
  size_t actions = 0;
  for (const auto& list : lowered.actions) actions += list.size();
  EXPECT_EQ(r.timeline.events.size(), actions);
  EXPECT_EQ(r.timeline.num_ranks, 3);
  EXPECT_EQ(r.timeline.title, "zb-v, P=3, M=6, V=2");
  // Simulating the lowered schedule gives the same result.
  const SimResult again = simulate(validate(lowered), costs(1, 1, 1, 0.1));
  EXPECT_DOUBLE_EQ(again.makespan, r.makespan);
}

TEST(Simulator, StageActivationOverridesChunkShare) {
  CostModel c = costs(1, 1, 1);
  c.stage_activation = {4, 1};  // stage 0 stashes four times what stage 1 does
  const SimResult r = run("gpipe", 2, 3, c);
  EXPECT_NEAR(r.ranks[0].peak_activations, 12, kEps);
  EXPECT_NEAR(r.ranks[1].peak_activations, 3, kEps);
  c.stage_activation = {1, 2, 3};
  EXPECT_THROW(run("gpipe", 2, 3, c), UserError);
}

TEST(Simulator, PerStageCostsSetTheBottleneck) {
  CostModel c = costs(1, 1, 1);
  c.stage_forward = {1, 3};
  c.stage_backward_input = {1, 3};
  c.stage_backward_weight = {1, 3};
  // Rank 1 is busy 9 per microbatch and starts after rank 0's first forward.
  const SimResult r = run("1f1b", 2, 4, c);
  EXPECT_NEAR(r.ranks[1].busy, 36, kEps);
  EXPECT_NEAR(r.makespan, 1 + 36 + 2, kEps);  // then rank 0's last B (I+W = 2)
}

TEST(Simulator, OverlapTakesTheSumOfItsParts) {
  Schedule s;
  s.name = "overlap";
  s.num_ranks = 1;
  s.num_stages = 1;
  s.num_microbatches = 2;
  s.stage_to_rank = {0};
  const Action both = Action::overlap({Action::make(Op::F, 0, 1), Action::make(Op::B, 0, 0)});
  s.actions = {{Action::make(Op::F, 0, 0), both, Action::make(Op::B, 0, 1)}};
  const SimResult r = simulate(validate(s), costs(1, 2, 1));
  EXPECT_NEAR(r.makespan, 1 + (1 + 3) + 3, kEps);
  EXPECT_NEAR(r.ranks[0].peak_activations, 2, kEps);
}

// An asynchronous schedule as `pptrain schedule` runs it: `steps` mini-batches of M in one list.
SimResult run_async(const std::string& name, int p, int m, const CostModel& c,
                    const FamilyValues& family = {}, int steps = 3) {
  ScheduleOptions options{name, p, steps * m};
  options.period = m;
  const Schedule schedule = make_schedule(options);
  return simulate(validate(schedule), c, version_rule_of(name, schedule.num_stages, m, family));
}

TEST(Simulator, PipeDreamKeepsVersionsAndCountsTheirMemory) {
  CostModel c = costs(1, 1, 1);
  c.weights = 2;
  const SimResult r = run_async("pipedream", 4, 8, c);
  const SimResult unweighted = run_async("pipedream", 4, 8, costs(1, 1, 1));
  ASSERT_EQ(r.ranks.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RankStats& s = r.ranks[rank];
    EXPECT_EQ(s.weight_versions, 4 - rank);
    EXPECT_NEAR(s.peak_activations, 4 - rank, kEps);  // 1F1B order: P - r in flight
    EXPECT_NEAR(s.peak_activations, unweighted.ranks[rank].peak_activations, kEps);
    EXPECT_NEAR(s.peak_memory, s.peak_activations + s.weight_versions * 2, kEps);
    EXPECT_NEAR(unweighted.ranks[rank].peak_memory, s.peak_activations, kEps);
  }
  // Vertical sync keeps S versions on every stage.
  for (const RankStats& s : run_async("pipedream", 4, 8, c, {{"--vertical-sync", true}}).ranks) {
    EXPECT_EQ(s.weight_versions, 4);
    EXPECT_NEAR(s.peak_memory, s.peak_activations + 4 * 2, kEps);
  }
  // The versions the simulator reports are the rule's, for every asynchronous schedule.
  for (const auto& name : schedule_names()) {
    const ScheduleEntry& entry = find_schedule(name);
    if (!entry.asynchronous()) continue;
    SCOPED_TRACE(name);
    const int stages = 4 * entry.default_chunks;
    const VersionRule rule = version_rule_of(name, stages, 8);
    const Schedule placed = make_schedule({name, 4, 8});
    const std::vector<int> expected = weight_versions_per_rank(rule, placed.stage_to_rank, 4);
    const SimResult a = run_async(name, 4, 8, c);
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(a.ranks[rank].weight_versions, expected[rank]);
      // Every version of each of the rank's stages, a chunk's weights 1/V of the rank's 2.
      double weights = 0;
      for (int st : placed.stages_of(rank)) {
        weights += rule.versions_kept(st) * 2.0 / entry.default_chunks;
      }
      EXPECT_NEAR(a.ranks[rank].peak_memory, a.ranks[rank].peak_activations + weights, kEps);
    }
  }
  // wpipe: each rank a first-group stage (2 versions) and a second-group one (1).
  EXPECT_EQ(run_async("wpipe", 4, 8, c).ranks[0].weight_versions, 2);
}

// pipemare's backward reruns the forward on its own weights: each B lasts B + F.
TEST(Simulator, PipeMareBackwardsIncludeTheRerunForward) {
  for (const std::string name : {"pipemare", "2bw"}) {
    const SimResult r = run_async(name, 4, 8, costs(1, 1, 1));
    const double expected = name == "pipemare" ? 3 : 2;
    int backwards = 0;
    for (const TimelineEvent& e : r.timeline.events) {
      if (e.action.op != Op::B) continue;
      ++backwards;
      EXPECT_NEAR(e.end - e.start, expected, kEps) << name;
    }
    EXPECT_EQ(backwards, 4 * 3 * 8) << name;
  }
}

TEST(Simulator, SynchronousSchedulesKeepOneVersion) {
  CostModel c = costs(1, 1, 1);
  c.weights = 2;
  // Interleaved: each of a rank's V chunks keeps one version of 1/V of its share.
  for (const SimResult& r : {run("1f1b", 4, 8, c), run("interleaved-1f1b", 4, 8, c, 2)}) {
    for (const RankStats& s : r.ranks) {
      EXPECT_EQ(s.weight_versions, 1);
      EXPECT_NEAR(s.peak_memory, s.peak_activations + 2, kEps) << r.timeline.title;
    }
  }
  // Per-stage weights: rank 0 holds stage 0's.
  c.stage_weights = {5, 1, 1, 1};
  EXPECT_NEAR(run("1f1b", 4, 8, c).ranks[0].peak_memory, 4 + 5, kEps);
}

TEST(Simulator, DefaultCostLeavesPeakMemoryAtTheActivations) {
  for (const auto& name : schedule_names()) {
    SCOPED_TRACE(name);
    for (const RankStats& s : run(name, 4, 8, costs(1, 1, 1)).ranks) {
      EXPECT_EQ(s.weight_versions, 1);  // the default rule is synchronous
      EXPECT_DOUBLE_EQ(s.peak_memory, s.peak_activations);
    }
  }
}

TEST(Simulator, RuleForAnotherStageCountIsRefused) {
  const ValidatedSchedule s = validate(make_schedule({"pipedream", 4, 16}));
  EXPECT_THROW(simulate(s, costs(1, 1, 1), version_rule_of("pipedream", 3, 8)), UserError);
}

Schedule two_rank_schedule(std::vector<std::vector<std::string>> texts) {
  Schedule s;
  s.name = "hand";
  s.num_ranks = 2;
  s.num_stages = 2;
  s.num_microbatches = 1;
  s.stage_to_rank = {0, 1};
  for (const auto& row : texts) {
    s.actions.emplace_back();
    for (const auto& t : row) s.actions.back().push_back(parse_action(t));
  }
  return s;
}

// The simulator takes only validated schedules: what it cannot run never reaches it.
TEST(Simulator, DeadlocksAndBadActionsAreRefusedBeforeSimulation) {
  const std::vector<std::vector<std::vector<std::string>>> bad = {
      {{"0B0", "0F0"}, {"1F0", "1B0"}},                // cross-rank cycle
      {{"0F0", "0W0", "0I0"}, {"1F0", "1I0", "1W0"}},  // W before its I
      {{"0F0", "0SEND_F0", "0B0"}, {"1F0", "1B0"}},    // a SEND without its RECV
      {{"0F0", "0B0"}, {"1F5", "1B0"}},                // outside the schedule
      {{"0F0", "1B0"}, {"1F0", "0B0"}},                // on the wrong rank
      {{"0F0", "0RECV_F0", "0B0"}, {"1F0", "1B0"}},    // from a stage that does not exist
  };
  for (const auto& rows : bad) EXPECT_THROW(validate(two_rank_schedule(rows)), ScheduleError);
}

TEST(CostModel, ParseReduceAndRingAllReduceTime) {
  const CostModel c = CostModel::parse("F=1,I=1,W=1,comm=0,reduce=3");
  EXPECT_EQ(c.reduce, 3);
  EXPECT_EQ(c.to_string(), "F=1,I=1,W=1,comm=0,reduce=3");
  EXPECT_EQ(CostModel::parse(c.to_string()).reduce, 3);
  EXPECT_EQ(CostModel::parse("F=2,reduce=0").to_string(), "F=2,I=1,W=1,comm=0");
  EXPECT_EQ(CostModel::parse("weights=2,reduce=1.5").to_string(),
            "F=1,I=1,W=1,comm=0,weights=2,reduce=1.5");
  EXPECT_THROW(CostModel::parse("reduce=-1"), UserError);
  // One replica: nothing to reduce.
  CostModel d = c;
  EXPECT_EQ(d.reduce_time(0, 2, 2), 0);
  d.replicas = 2;
  EXPECT_EQ(d.reduce_time(0, 2, 2), 3);
  EXPECT_EQ(d.time(parse_action("3REDUCE_GRAD"), 4, 2), 1.5);  // V = 2: a chunk's half
  d.replicas = 0;
  EXPECT_THROW(d.reduce_time(0, 2, 2), UserError);
  // The ring: 2 (D-1)/D x bytes / bandwidth + latency, per stage.
  CostModel ring;
  ring.replicas = 4;
  ring.stage_grad_bytes = {4e6, 2e6};
  EXPECT_THROW(ring.reduce_time(0, 2, 2), UserError);  // no bandwidth
  ring.reduce_bandwidth = 1e6;
  ring.reduce_latency = 0.5;
  EXPECT_DOUBLE_EQ(ring.reduce_time(0, 2, 2), 2.0 * 3 / 4 * 4 + 0.5);
  EXPECT_DOUBLE_EQ(ring.reduce_time(1, 2, 2), 2.0 * 3 / 4 * 2 + 0.5);
  EXPECT_THROW(ring.reduce_time(0, 3, 3), UserError);  // 2 entries for 3 stages
  ring.replicas = 1;
  EXPECT_EQ(ring.reduce_time(0, 2, 2), 0);
}

// The reduction events of a result, by rank, in start order.
std::vector<std::vector<TimelineEvent>> reductions_by_rank(const SimResult& r) {
  std::vector<std::vector<TimelineEvent>> out(r.timeline.num_ranks);
  for (const auto& e : r.timeline.events) {
    if (e.action.op == Op::REDUCE_GRAD) out[e.rank].push_back(e);
  }
  for (auto& list : out) {
    std::sort(list.begin(), list.end(),
              [](const TimelineEvent& a, const TimelineEvent& b) { return a.start < b.start; });
  }
  return out;
}

TEST(Simulator, OneFOneBReducesUnderTheCoolDown) {
  // P = 2, M = 4, F = I = W = 1 (B = 2): the compute ends at (M + P - 1)(F + B) = 15; rank 1's
  // last B ends at 13, rank 0's at 15. Each reduction takes reduce = 3 (D = 2).
  CostModel c = costs(1, 1, 1);
  c.reduce = 3;
  c.replicas = 2;
  const Schedule plain = make_schedule({"1f1b", 2, 4});
  const SimResult base = simulate(validate(plain), c);
  ASSERT_DOUBLE_EQ(base.makespan, 15);
  const SimResult r = simulate(validate(add_grad_reductions(plain)), c);
  const auto reductions = reductions_by_rank(r);
  ASSERT_EQ(reductions[1].size(), 1u);
  EXPECT_EQ(to_string(reductions[1][0].action), "1REDUCE_GRAD");
  EXPECT_DOUBLE_EQ(reductions[1][0].start, 13);  // at its last B's end
  EXPECT_DOUBLE_EQ(reductions[1][0].end, 16);    // 1 past the compute: hidden but for 1
  ASSERT_EQ(reductions[0].size(), 1u);
  EXPECT_DOUBLE_EQ(reductions[0][0].start, 15);
  EXPECT_DOUBLE_EQ(reductions[0][0].end, 18);
  EXPECT_DOUBLE_EQ(r.makespan, 18);
  // Busy is compute only; the exposed tail of the all-reduce is idle and bubble.
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_DOUBLE_EQ(r.ranks[rank].busy, base.ranks[rank].busy);
    EXPECT_DOUBLE_EQ(r.ranks[rank].idle, 18 - base.ranks[rank].busy);
  }
  EXPECT_DOUBLE_EQ(r.cost, 18);
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 1 - 2 * 12.0 / (2 * 18));
  // One replica: the reductions are free and change nothing.
  c.replicas = 1;
  const SimResult alone = simulate(validate(add_grad_reductions(plain)), c);
  EXPECT_DOUBLE_EQ(alone.makespan, base.makespan);
  EXPECT_DOUBLE_EQ(alone.bubble_ratio, base.bubble_ratio);
}

TEST(Simulator, RingReductionTimesFromBytesBandwidthAndLatency) {
  CostModel c = costs(1, 1, 1);
  c.replicas = 4;
  c.stage_grad_bytes = {4e6, 8e6};
  c.reduce_bandwidth = 1e6;
  c.reduce_latency = 0.25;
  const SimResult r = simulate(validate(add_grad_reductions(make_schedule({"1f1b", 2, 4}))), c);
  const auto reductions = reductions_by_rank(r);
  EXPECT_DOUBLE_EQ(reductions[0][0].end - reductions[0][0].start, 2.0 * 3 / 4 * 4 + 0.25);
  EXPECT_DOUBLE_EQ(reductions[1][0].end - reductions[1][0].start, 2.0 * 3 / 4 * 8 + 0.25);
  EXPECT_DOUBLE_EQ(r.makespan, 13 + 2.0 * 3 / 4 * 8 + 0.25);  // rank 1's ends last
}

TEST(Simulator, ReductionsDelayNoComputeAndShareOneChannelPerRank) {
  // Every synchronous schedule, compute-only and lowered: the compute events are where they are
  // without reductions, each reduction starts at the end of the action before it or after the
  // rank's previous reduction, and one rank's reductions never overlap.
  CostModel c = costs(1, 2, 1.5, 0.25);
  c.reduce = 7;
  c.replicas = 8;
  for (const auto& name : schedule_names()) {
    if (find_schedule(name).asynchronous()) continue;
    SCOPED_TRACE(name);
    const Schedule plain = make_schedule({name, 4, 8});
    const SimResult base = simulate(validate(plain), c);
    const ValidatedSchedule reduced = validate(add_grad_reductions(plain));
    const SimResult r = simulate(reduced, c);
    std::vector<TimelineEvent> compute, base_compute;
    for (const auto& e : r.timeline.events) {
      if (is_compute(e.action.op)) compute.push_back(e);
    }
    for (const auto& e : base.timeline.events) {
      if (is_compute(e.action.op)) base_compute.push_back(e);
    }
    ASSERT_EQ(compute.size(), base_compute.size());
    for (size_t k = 0; k < compute.size(); ++k) {
      EXPECT_EQ(compute[k].action, base_compute[k].action);
      EXPECT_DOUBLE_EQ(compute[k].start, base_compute[k].start) << to_string(compute[k].action);
    }
    const auto reductions = reductions_by_rank(r);
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(reductions[rank].size(), plain.stages_of(rank).size());
      double channel = 0;
      for (const auto& e : reductions[rank]) {
        const auto& list = reduced->actions[rank];
        const size_t at = std::find(list.begin(), list.end(), e.action) - list.begin();
        ASSERT_GT(at, 0u);
        double previous_end = 0;  // the event of the action before it
        for (const auto& other : r.timeline.events) {
          if (other.rank == rank && other.action == list[at - 1]) previous_end = other.end;
        }
        EXPECT_DOUBLE_EQ(e.start, std::max(previous_end, channel)) << to_string(e.action);
        EXPECT_DOUBLE_EQ(e.end - e.start, 7.0 / plain.chunks());
        channel = e.end;
      }
      EXPECT_LE(channel, r.makespan + kEps);
    }
    EXPECT_GE(r.makespan, base.makespan);
  }
}

// A profile's layers summed per stage; the cut's transfer and the ring all-reduce from its
// measured bandwidth and latency (bytes per ms = bytes per s / 1000).
TEST(CostFromProfile, SumsStagesAndTimesTheNetwork) {
  Profile profile;
  profile.source = "p.json";
  for (int l = 0; l < 3; ++l) {
    LayerProfile layer;
    layer.forward_ms = 1 + l;
    layer.backward_input_ms = 2 + l;
    layer.backward_weight_ms = 3 + l;
    layer.activation_bytes = 1000 * (l + 1);
    layer.parameter_bytes = 4000 * (l + 1);
    profile.layers.push_back(layer);
  }
  EXPECT_THROW(cost_from_profile(profile, {{0, 1}, {2, 2}}, 2), UserError);  // no network
  profile.network = {2, 1e6, 0.5};                                           // 1000 bytes per ms
  const CostModel cost = cost_from_profile(profile, {{0, 1}, {2, 2}}, 2);
  EXPECT_EQ(cost.stage_forward, (std::vector<double>{3, 3}));
  EXPECT_EQ(cost.stage_backward_input, (std::vector<double>{5, 4}));
  EXPECT_EQ(cost.stage_backward_weight, (std::vector<double>{7, 5}));
  EXPECT_DOUBLE_EQ(cost.comm, 0.5 + 2000.0 / 1000);  // the cut after layer 1
  // 2 (D-1)/D x 12000 bytes / 1000 bytes per ms + 0.5 ms.
  EXPECT_DOUBLE_EQ(cost.reduce_time(0, 2, 2), 12.0 + 0.5);
  EXPECT_THROW(cost_from_profile(profile, {{0, 0}, {2, 2}}, 1), UserError);  // a gap
  EXPECT_THROW(cost_from_profile(profile, {{0, 1}}, 1), UserError);          // layer 2 left out
  // Without an "overheads" object the actions cost only their compute; with one, its figures.
  EXPECT_FALSE(cost.counts_overheads());
  profile.overheads = {0.02, 0.05, 0.03};
  const CostModel with = cost_from_profile(profile, {{0, 1}, {2, 2}}, 1);
  EXPECT_EQ(with.action_overhead, 0.02);
  EXPECT_EQ(with.send_overhead, 0.05);
  EXPECT_EQ(with.recv_overhead, 0.03);
}

// BitPipe (generators/families/bidirectional.cpp) against the schedules it is built from: less
// bubble than interleaved-1f1b (V = 2) and Chimera at F = I = W, and, its two directions holding
// their activations at once, at most twice 1F1B's peak.
TEST(Simulator, BitPipeHasLessBubbleThanInterleavedAndChimera) {
  const CostModel c = costs(1, 1, 1);
  for (const auto& [p, m] : {std::pair{4, 16}, std::pair{8, 32}, std::pair{8, 64}}) {
    SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
    const SimResult bitpipe = run("bitpipe", p, m, c);
    EXPECT_LT(bitpipe.bubble_ratio, run("interleaved-1f1b", p, m, c, 2).bubble_ratio);
    EXPECT_LT(bitpipe.bubble_ratio, run("chimera", p, m, c).bubble_ratio);
    const double one_f_one_b = run("1f1b", p, m, c).ranks[0].peak_activations;
    for (const RankStats& rank : bitpipe.ranks) {
      EXPECT_LE(rank.peak_activations, 2 * one_f_one_b + kEps) << "rank " << rank.rank;
    }
  }
}

// Chimera against the closed forms of generators.h: bubble (M/P)(P-2) max(F, B) on every rank,
// peak activations P/2 + 1 + min(r, P-1-r).
TEST(Simulator, ChimeraBubbleAndMemoryClosedForms) {
  for (int p : {2, 4, 6, 8}) {
    for (int units : {1, 2, 3}) {
      const int m = units * p;
      for (const CostModel& c : {costs(1, 0.5, 0.5), costs(1, 1, 1), costs(2, 0.5, 0.5),
                                 costs(1, 1.5, 1), costs(3, 1, 1)}) {
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " " + c.to_string());
        const SimResult r = simulate(validate(make_chimera(p, m)), until_i(c));
        const double f = c.forward, b = c.backward_input + c.backward_weight;
        const std::vector<double> bubbles = bubble_times(r);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(bubbles[rank], units * (p - 2) * std::max(f, b), kEps) << "rank " << rank;
          EXPECT_NEAR(r.ranks[rank].peak_activations, p / 2 + 1 + std::min(rank, p - 1 - rank),
                      kEps)
              << "rank " << rank;
        }
        // The same peak in the default memory model: a fused B keeps no stash for a W.
        EXPECT_NEAR(simulate(validate(make_chimera(p, m)), c).ranks[0].peak_activations,
                    r.ranks[0].peak_activations, kEps);
      }
    }
  }
}

// GEMS: bubble (M/2)(P-2)(F+B) on every rank, peak 2, and at most one microbatch of a direction
// in flight at a time: on every stage, the F-to-B intervals of one direction never overlap, and
// a direction's next microbatch enters after the previous one's backward left stage 0.
TEST(Simulator, GemsOneMicrobatchInFlightPerDirection) {
  for (int p : {2, 4, 6, 8}) {
    for (int m : {2, 4, 6, 10}) {
      for (const CostModel& c : {costs(1, 0.5, 0.5), costs(1, 1, 1), costs(2, 0.5, 1.5)}) {
        SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m) + " " + c.to_string());
        const SimResult r = simulate(validate(make_gems(p, m)), until_i(c));
        const double per_round = c.forward + c.backward_input + c.backward_weight;
        const std::vector<double> bubbles = bubble_times(r);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(bubbles[rank], (m / 2) * (p - 2) * per_round, kEps) << "rank " << rank;
          EXPECT_NEAR(r.ranks[rank].peak_activations, 2, kEps) << "rank " << rank;
        }
        std::map<std::pair<int, int>, std::pair<double, double>> span;  // (stage, mb) -> F..B
        for (const auto& e : r.timeline.events) {
          if (e.action.op == Op::F) span[{e.action.stage, e.action.microbatch}].first = e.start;
          if (e.action.op == Op::B) span[{e.action.stage, e.action.microbatch}].second = e.end;
        }
        const auto at = [&](int stage, int mb) { return span[std::make_pair(stage, mb)]; };
        for (int stage = 0; stage < p; ++stage) {
          for (int mb = 0; mb + 1 < m; ++mb) {
            if (mb + 1 == m / 2) continue;  // the next one goes the other way
            EXPECT_GE(at(stage, mb + 1).first + kEps, at(stage, mb).second)
                << "stage " << stage << " microbatch " << mb + 1;
            EXPECT_GE(at(0, mb + 1).first + kEps, at(0, mb).second);
          }
        }
      }
    }
  }
}

// 1F1B-RR: a replica of stage s holds at most its warm-up plus one of its own microbatches,
// min(ceil(sum_{t >= s} r_t / r_s), its microbatches); its compute is its own microbatches'.
TEST(Simulator, RoundRobinReplicasHoldTheirWarmUp) {
  for (const std::vector<int>& replicas :
       std::vector<std::vector<int>>{{3, 1}, {1, 3}, {2, 1, 2}, {1, 1, 1, 1}, {3, 2, 1}}) {
    for (int m : {3, 6, 13}) {
      const Schedule s = make_1f1b_rr(replicas, m);
      const SimResult r = simulate(validate(s), until_i(costs(1, 1, 1, 0.25)));
      int base = 0;
      for (size_t stage = 0; stage < replicas.size(); ++stage) {
        int after = 0;
        for (size_t t = stage; t < replicas.size(); ++t) after += replicas[t];
        const int in_flight = (after + replicas[stage] - 1) / replicas[stage];
        for (int k = 0; k < replicas[stage]; ++k) {
          const int own = (m - k + replicas[stage] - 1) / replicas[stage];
          EXPECT_NEAR(r.ranks[base + k].peak_activations, std::min(in_flight, own), kEps)
              << "stage " << stage << " replica " << k << " M=" << m;
          EXPECT_NEAR(r.ranks[base + k].busy, own * 3.0, kEps);
        }
        base += replicas[stage];
      }
    }
  }
}

// A reduction over a stage's replicas ends for all of them at the latest replica's start plus
// the all-reduce time over r replicas: the scalar `reduce`, or the ring formula with r.
TEST(Simulator, ReplicaReductionsEndTogether) {
  CostModel c = costs(1, 1, 1);
  c.reduce = 3;
  const SimResult chimera = simulate(validate(add_grad_reductions(make_chimera(4, 8))), c);
  std::map<int, std::vector<TimelineEvent>> by_stage;
  for (const auto& e : chimera.timeline.events) {
    if (e.action.op == Op::REDUCE_GRAD) by_stage[e.action.stage].push_back(e);
  }
  ASSERT_EQ(by_stage.size(), 4u);
  for (const auto& [stage, events] : by_stage) {
    ASSERT_EQ(events.size(), 2u) << "stage " << stage;
    EXPECT_EQ(events[0].rank + events[1].rank, 3);  // ranks s and P-1-s
    EXPECT_DOUBLE_EQ(events[0].end, events[1].end);
    EXPECT_DOUBLE_EQ(events[0].end, std::max(events[0].start, events[1].start) + 3);
  }
  // The compute is where it is without the reductions.
  EXPECT_DOUBLE_EQ(simulate(validate(make_chimera(4, 8)), c).ranks[1].busy, chimera.ranks[1].busy);

  CostModel ring = costs(1, 1, 1);
  ring.stage_grad_bytes = {6, 6};
  ring.reduce_bandwidth = 2;
  ring.reduce_latency = 0.5;
  const SimResult rr = simulate(validate(add_grad_reductions(make_1f1b_rr({3, 1}, 6))), ring);
  std::vector<TimelineEvent> stage0;
  for (const auto& e : rr.timeline.events) {
    if (e.action.op == Op::REDUCE_GRAD) stage0.push_back(e);
  }
  ASSERT_EQ(stage0.size(), 3u);  // stage 1 has one replica: no reduction
  double latest = 0;
  for (const auto& e : stage0) latest = std::max(latest, e.start);
  for (const auto& e : stage0) {
    EXPECT_EQ(e.action.stage, 0);
    EXPECT_DOUBLE_EQ(e.end, latest + 2.0 * 2 / 3 * 6 / 2 + 0.5);  // 2 (r-1)/r x bytes / bw + lat
  }
}

// Shared cores: with a core per rank the clock-driven run gives the same timeline as the
// event-driven one, for every schedule; with fewer, the ranks' compute is shared out.
TEST(SharedCores, ACorePerRankChangesNothing) {
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"}) {
    SCOPED_TRACE(name);
    const ValidatedSchedule s = validate(make_schedule({name, 4, 8}));
    CostModel cost = CostModel::parse("F=1,I=1.5,W=0.7,comm=0.2");
    const SimResult alone = simulate(s, cost);
    cost.cores = 4;
    const SimResult shared = simulate(s, cost);
    EXPECT_NEAR(shared.makespan, alone.makespan, 1e-9);
    EXPECT_NEAR(shared.bubble_ratio, alone.bubble_ratio, 1e-9);
    ASSERT_EQ(shared.timeline.events.size(), alone.timeline.events.size());
    for (int r = 0; r < 4; ++r) {
      EXPECT_NEAR(shared.ranks[r].peak_activations, alone.ranks[r].peak_activations, 1e-9);
    }
  }
}

TEST(SharedCores, ComputeIsSharedOut) {
  // One microbatch through 2 ranks never computes on both at once: one core suffices.
  CostModel cost = CostModel::parse("F=1,I=1,W=1");
  cost.cores = 1;
  EXPECT_DOUBLE_EQ(simulate(validate(make_schedule({"1f1b", 2, 1})), cost).makespan, 6);
  // GPipe on 2 ranks, 4 microbatches, F = 1, B = 2, one core: every moment from the first F to
  // the last B some rank computes, so the makespan is the total work, 2 x 4 x 3 = 24 (a core
  // each: 15).
  const ValidatedSchedule gpipe = validate(make_schedule({"gpipe", 2, 4}));
  const SimResult one = simulate(gpipe, cost);
  EXPECT_NEAR(one.makespan, 24, 1e-9);
  cost.cores = 0;
  EXPECT_NEAR(simulate(gpipe, cost).makespan, 15, 1e-9);
  // Half a core each (1 core for 2 ranks) is between: no faster than a core each, no slower
  // than all the work on the shared core.
  cost.cores = 1.5;
  const double between = simulate(gpipe, cost).makespan;
  EXPECT_GT(between, 15);
  EXPECT_LT(between, 24);
}

TEST(SharedCores, ReductionsTakeACoreToo) {
  // 1f1b, P = 2, M = 4, F = I = W = 1, reduce = 3 at D = 2 (OneFOneBReducesUnderTheCoolDown).
  CostModel c = costs(1, 1, 1);
  c.reduce = 3;
  c.replicas = 2;
  const ValidatedSchedule s = validate(add_grad_reductions(make_schedule({"1f1b", 2, 4})));
  // Two cores: rank 1's reduction (13 to 16) overlaps rank 0's last B, a core each, as in run().
  c.cores = 2;
  const SimResult two = simulate(s, c);
  EXPECT_NEAR(two.makespan, 18, 1e-9);
  const auto reductions = reductions_by_rank(two);
  EXPECT_NEAR(reductions[1][0].start, 13, 1e-9);
  EXPECT_NEAR(reductions[1][0].end, 16, 1e-9);
  // One core: something runs at every moment, so the makespan is all the work, the 24 of
  // compute and the two reductions' 6 (were a reduction free, 24 + rank 0's 3 = 27).
  c.cores = 1;
  EXPECT_NEAR(simulate(s, c).makespan, 30, 1e-9);
}

// Record::kFigures keeps no timeline but gives every figure of Record::kTimeline, bit for bit:
// every schedule of the registry (its own weight rule), uneven costs with communication, shared
// cores, data-parallel reductions, a replicated schedule and a skip connection.
TEST(Simulator, FiguresWithoutTimelineEqualThoseWithIt) {
  const auto expect_same = [](const ValidatedSchedule& s, const CostModel& c,
                              const VersionRule& rule, const std::string& what) {
    const SimResult all = simulate(s, c, rule, Record::kTimeline);
    const SimResult figures = simulate(s, c, rule, Record::kFigures);
    EXPECT_TRUE(figures.timeline.events.empty()) << what;
    EXPECT_FALSE(all.timeline.events.empty()) << what;
    EXPECT_EQ(figures.makespan, all.makespan) << what;
    EXPECT_EQ(figures.cost, all.cost) << what;
    EXPECT_EQ(figures.bubble_ratio, all.bubble_ratio) << what;
    ASSERT_EQ(figures.ranks.size(), all.ranks.size()) << what;
    for (size_t r = 0; r < all.ranks.size(); ++r) {
      EXPECT_EQ(figures.ranks[r].busy, all.ranks[r].busy) << what << " rank " << r;
      EXPECT_EQ(figures.ranks[r].idle, all.ranks[r].idle) << what << " rank " << r;
      EXPECT_EQ(figures.ranks[r].peak_activations, all.ranks[r].peak_activations)
          << what << " rank " << r;
      EXPECT_EQ(figures.ranks[r].peak_memory, all.ranks[r].peak_memory) << what << " rank " << r;
      EXPECT_EQ(figures.ranks[r].weight_versions, all.ranks[r].weight_versions)
          << what << " rank " << r;
    }
  };
  CostModel uneven = costs(1, 1.7, 0.6, 0.3);
  uneven.weights = 2;
  CostModel shared = uneven;
  shared.cores = 1.5;
  size_t made = 0;
  for (const ScheduleEntry& entry : schedule_registry()) {
    const int p = 4, m = 8;
    Schedule plain;
    try {
      plain = make_schedule({entry.name, p, m});
    } catch (const UserError&) {
      continue;  // needs other parameters (a schedule file, a V-shape's M)
    }
    ++made;
    const VersionRule rule = version_rule_of(entry.name, plain.num_stages, m);
    const ValidatedSchedule s = validate(plain);
    for (const auto& [cost, name] :
         {std::pair{costs(1, 1, 1), "F=I=W=1"}, std::pair{uneven, "uneven, comm=0.3, weights=2"},
          std::pair{shared, "shared cores"}}) {
      expect_same(s, cost, rule, entry.name + ", " + name);
    }
    if (!plain.flushes) continue;
    CostModel dp = uneven;
    dp.reduce = 2.5;
    dp.replicas = 2;
    expect_same(validate(add_grad_reductions(plain)), dp, rule, entry.name + ", --dp 2");
  }
  CostModel ring = uneven;
  ring.reduce = 1.5;
  expect_same(validate(add_grad_reductions(make_1f1b_rr({3, 1}, 6))), ring, VersionRule{},
              "1f1b-rr 3+1");
  EXPECT_GE(made + 2, schedule_registry().size()) << "schedules left out of the comparison";
  Schedule skip = parse_csv("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n2F0,2F1,2B0,2B1\n");
  skip.skips = {{0, 2}};
  CostModel skip_cost = uneven;
  skip_cost.skip_comm = 2;
  expect_same(validate(skip), skip_cost, VersionRule{}, "a skip from stage 0 to 2");
}

}  // namespace
}  // namespace pptrain
