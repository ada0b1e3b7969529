#include "pptrain/partition/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "pptrain/common/check.h"
#include "pptrain/partition/testing.h"

namespace pptrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Costs of the same order as the shipped profiles: milliseconds of compute, megabytes of
// weights and activations, so that compute, sync and transfer all compete at ~1-10 GB/s.
Profile random_profile(std::mt19937& rng, int layers) {
  std::uniform_real_distribution<double> ms(0.0, 10.0), mb(0.0, 40.0);
  std::bernoulli_distribution no_weights(0.3);
  Profile p;
  p.source = "random";
  for (int i = 0; i < layers; ++i) {
    LayerProfile l;
    l.name = "l" + std::to_string(i);
    l.forward_ms = ms(rng);
    l.backward_input_ms = ms(rng);
    l.backward_weight_ms = ms(rng) / 2;
    l.activation_bytes = mb(rng) * 1e6;
    l.stash_bytes = mb(rng) * 1e6;
    l.parameter_bytes = no_weights(rng) ? 0 : mb(rng) * 1e6;
    p.layers.push_back(l);
  }
  return p;
}

bool near(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max({1.0, a, b});
}

// ---- brute force for uniform/params/time: every set of P-1 cut positions --------------------

double direct_compute_s(const Profile& p, int first, int last) {
  double ms = 0;
  for (int l = first; l <= last; ++l)
    ms += p.layers[l].forward_ms + p.layers[l].backward_input_ms + p.layers[l].backward_weight_ms;
  return ms / 1000;
}

double direct_params(const Profile& p, int first, int last) {
  double bytes = 0;
  for (int l = first; l <= last; ++l) bytes += p.layers[l].parameter_bytes;
  return bytes;
}

// The smallest bottleneck over all ways to cut into `parts` stages; cost(first, last).
double brute_min_max(int layers, int parts, const std::function<double(int, int)>& cost) {
  double best = kInf;
  std::function<void(int, int, double)> rec = [&](int first, int left, double worst) {
    if (left == 1) {
      best = std::min(best, std::max(worst, cost(first, layers - 1)));
      return;
    }
    for (int last = first; last <= layers - left; ++last) {
      rec(last + 1, left - 1, std::max(worst, cost(first, last)));
    }
  };
  rec(0, parts, 0);
  return best;
}

double brute_time_cost(const Profile& p, int first, int last, double bandwidth, double speed = 1) {
  double t = direct_compute_s(p, first, last) / speed;
  if (bandwidth > 0 && first > 0)
    t = std::max(t, 2 * p.layers[first - 1].activation_bytes / bandwidth);
  if (bandwidth > 0 && last + 1 < static_cast<int>(p.layers.size()))
    t = std::max(t, 2 * p.layers[last].activation_bytes / bandwidth);
  return t;
}

void expect_contiguous(const Partition& part, int layers, int stages) {
  ASSERT_EQ(static_cast<int>(part.stages.size()), stages);
  EXPECT_NO_THROW(check_partition(part, layers));
}

PartitionOptions unreplicated(const std::string& method, int stages, double bandwidth = 0) {
  PartitionOptions o;
  o.method = method;
  o.stages = stages;
  o.bandwidth_bytes_per_s = bandwidth;
  return o;
}

TEST(TimePartition, IsOptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    int L = 1 + trial % 9;
    int P = 1 + static_cast<int>(rng() % L);
    double bw = trial % 3 == 0 ? 0 : (trial % 3 == 1 ? 1e9 : 1e10);
    Profile prof = random_profile(rng, L);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " L=" << L << " P=" << P << " bw=" << bw);
    Partition part = make_partition(prof, unreplicated("time", P, bw));
    expect_contiguous(part, L, P);
    double best =
        brute_min_max(L, P, [&](int i, int j) { return brute_time_cost(prof, i, j, bw); });
    EXPECT_TRUE(near(part.time_per_minibatch_s, best))
        << part.time_per_minibatch_s << " vs " << best;
    // The stages it returns really achieve the bottleneck it reports.
    double worst = 0;
    for (const StagePlan& s : part.stages) {
      EXPECT_TRUE(near(s.compute_s, direct_compute_s(prof, s.first_layer, s.last_layer)));
      EXPECT_EQ(s.replicas, 1);
      worst = std::max(worst, brute_time_cost(prof, s.first_layer, s.last_layer, bw));
    }
    EXPECT_TRUE(near(worst, part.time_per_minibatch_s));
    EXPECT_TRUE(near(part.speedup_vs_single, direct_compute_s(prof, 0, L - 1) / worst));
  }
}

// With worker speeds, the brute force over every cut (stage p's compute divided by speed p)
// agrees, and all speeds 1 is the cut without speeds, to the bit.
TEST(TimePartition, WithWorkerSpeedsIsOptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> speed(0.2, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + trial % 9;
    const int P = 1 + static_cast<int>(rng() % L);
    const double bw = trial % 2 == 0 ? 0 : 1e9;
    const Profile prof = random_profile(rng, L);
    PartitionOptions options = unreplicated("time", P, bw);
    const Partition equal = make_partition(prof, options);
    options.stage_speeds.assign(P, 1.0);
    const Partition ones = make_partition(prof, options);
    EXPECT_EQ(to_json(ones), to_json(equal));
    for (double& s : options.stage_speeds) s = speed(rng);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " L=" << L << " P=" << P);
    const Partition part = make_partition(prof, options);
    expect_contiguous(part, L, P);
    double best = kInf;
    std::function<void(int, int, double)> rec = [&](int first, int p, double worst) {
      auto cost = [&](int last) {
        return brute_time_cost(prof, first, last, bw, options.stage_speeds[p]);
      };
      if (p == P - 1) {
        best = std::min(best, std::max(worst, cost(L - 1)));
        return;
      }
      for (int last = first; last <= L - (P - p); ++last) {
        rec(last + 1, p + 1, std::max(worst, cost(last)));
      }
    };
    rec(0, 0, 0);
    EXPECT_TRUE(near(part.time_per_minibatch_s, best))
        << part.time_per_minibatch_s << " vs " << best;
    for (int p = 0; p < P; ++p) {
      const StagePlan& stage = part.stages[p];
      EXPECT_TRUE(near(
          stage.compute_s,
          direct_compute_s(prof, stage.first_layer, stage.last_layer) / options.stage_speeds[p]));
    }
  }
}

// Two equal workers split eight equal layers 4+4; a worker at a third of the speed of the other
// gets a quarter of them (2+6 would be slower on it, 1+7 slower on the fast one).
TEST(TimePartition, ASlowWorkerGetsFewerLayers) {
  Profile p;
  for (int i = 0; i < 8; ++i) p.layers.push_back({"l" + std::to_string(i), 1, 1, 1, 0, 0, 0});
  PartitionOptions options = unreplicated("time", 2);
  EXPECT_EQ(make_partition(p, options).stages[0].last_layer, 3);
  options.stage_speeds = {1.0, 1.0 / 3};
  const Partition slow_last = make_partition(p, options);
  EXPECT_EQ(slow_last.stages[0].last_layer, 5);
  EXPECT_DOUBLE_EQ(slow_last.time_per_minibatch_s, 0.018);  // 6 layers x 3 ms on the fast one
  options.stage_speeds = {1.0 / 3, 1.0};
  EXPECT_EQ(make_partition(p, options).stages[0].last_layer, 1);
  options.stage_speeds = {1.0, 0.0};
  EXPECT_THROW(make_partition(p, options), UserError);
  options.stage_speeds = {1.0};
  EXPECT_THROW(make_partition(p, options), UserError);
  options = unreplicated("uniform", 2);
  options.stage_speeds = {1.0, 0.5};
  EXPECT_THROW(make_partition(p, options), UserError);
}

TEST(TimePartition, SlowLinkMovesTheCut) {
  // Two equal halves, but the middle cut carries 1 GB; a cut after layer 0 carries little.
  Profile p;
  for (double act : {1e3, 1e9, 1e3}) p.layers.push_back({"l", 5, 5, 0, act, 0, 0});
  p.layers[1].forward_ms = 0;  // layers: 10 ms, 0 ms, 10 ms
  p.layers[1].backward_input_ms = 0;
  Partition compute_only = make_partition(p, unreplicated("time", 2));
  EXPECT_DOUBLE_EQ(compute_only.time_per_minibatch_s, 0.010);
  Partition with_link = make_partition(p, unreplicated("time", 2, 1e9));
  // Cutting after layer 1 would send 2 x 1 GB at 1 GB/s: 2 s. Cutting after layer 0 costs
  // 2 kB of transfer and puts the empty layer 1 with layer 2.
  EXPECT_EQ(with_link.stages[0].last_layer, 0);
  EXPECT_DOUBLE_EQ(with_link.time_per_minibatch_s, 0.010);
}

TEST(ParamsPartition, IsOptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    int L = 1 + trial % 9;
    int P = 1 + static_cast<int>(rng() % L);
    Profile prof = random_profile(rng, L);
    Partition part = make_partition(prof, unreplicated("params", P));
    expect_contiguous(part, L, P);
    double worst = 0;
    for (const StagePlan& s : part.stages)
      worst = std::max(worst, direct_params(prof, s.first_layer, s.last_layer));
    double best = brute_min_max(L, P, [&](int i, int j) { return direct_params(prof, i, j); });
    EXPECT_TRUE(near(worst, best)) << "trial " << trial << ": " << worst << " vs " << best;
  }
}

TEST(UniformPartition, EqualLayerCountsFirstStagesTakeTheRest) {
  Profile prof;
  prof.layers.assign(10, LayerProfile{"l", 1, 1, 0, 0, 0, 0});
  Partition part = make_partition(prof, unreplicated("uniform", 4));
  expect_contiguous(part, 10, 4);
  std::vector<int> sizes;
  for (const StagePlan& s : part.stages) sizes.push_back(s.last_layer - s.first_layer + 1);
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 2, 2}));
  EXPECT_DOUBLE_EQ(part.time_per_minibatch_s, 0.006);  // 3 layers x 2 ms
  EXPECT_DOUBLE_EQ(part.speedup_vs_single, 20.0 / 6.0);
}

// ---- brute force for pipedream: every (contiguous stages x replica counts) -----------------
//
// Written from the cost model in docs/PARTITIONING.md, not from the planner: the time of
// layers lo..hi as one unit of a level is the best pipeline of the level below over them.

class BrutePipeDream {
 public:
  BrutePipeDream(const Profile& p, std::vector<Level> levels, double memory)
      : p_(p), levels_(std::move(levels)), memory_(memory) {}

  double best(int level, int lo, int hi) {
    auto key = std::make_tuple(level, lo, hi);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    double result = kInf;
    enumerate(level, lo, hi, lo, 0, 0.0, result);
    return memo_[key] = result;
  }

  // The slowest stage of an explicit flat pipeline (one level).
  double flat_time(const std::vector<StagePlan>& stages) {
    double worst = 0;
    int used = 0;
    for (const StagePlan& s : stages) {
      used += s.replicas;
      worst = std::max(worst, stage(0, 0, s.first_layer, s.last_layer, s.replicas, used));
    }
    return worst;
  }

 private:
  // Time of stage first..last on `r` workers of `level`, with `used` workers through it, in a
  // pipeline that starts at layer `lo`.
  double stage(int level, int lo, int first, int last, int r, int used) {
    const int N = levels_[level].workers;
    const double bw = levels_[level].bandwidth_bytes_per_s;
    const int L = static_cast<int>(p_.layers.size());
    double unit = level == 0 ? direct_compute_s(p_, first, last) : best(level - 1, first, last);
    double params = direct_params(p_, first, last);
    double stash = 0;
    for (int l = first; l <= last; ++l) stash += p_.layers[l].stash_bytes;
    double in_flight = std::max(1.0, std::ceil(double(N - used) / r));
    if (!std::isfinite(unit) || (memory_ > 0 && in_flight * (stash + params) > memory_))
      return kInf;
    double sync = 4.0 * (r - 1) * params / (bw * r);
    if (first == lo) {  // the first stage: sync divided by the workers of the level below
      double within = level == 0 ? 1 : levels_[level - 1].workers;
      return (unit + sync / within) / r;
    }
    double t = (unit + sync) / r;
    t = std::max(t, 2 * p_.layers[first - 1].activation_bytes / (bw * r));
    if (last < L - 1) t = std::max(t, 2 * p_.layers[last].activation_bytes / (bw * r));
    return t;
  }

  void enumerate(int level, int lo, int hi, int pos, int used, double worst, double& result) {
    const int N = levels_[level].workers;
    if (pos > hi) {
      if (used == N) result = std::min(result, worst);
      return;
    }
    for (int last = pos; last <= hi; ++last) {
      for (int r = 1; used + r <= N; ++r) {
        if (last == hi && used + r != N) continue;  // every worker is used
        double t = stage(level, lo, pos, last, r, used + r);
        if (std::isfinite(t))
          enumerate(level, lo, hi, last + 1, used + r, std::max(worst, t), result);
      }
    }
  }

  const Profile& p_;
  std::vector<Level> levels_;
  double memory_;
  std::map<std::tuple<int, int, int>, double> memo_;
};

PartitionOptions pipedream(std::vector<Level> levels, double memory = 0) {
  PartitionOptions o;
  o.method = "pipedream";
  o.levels = std::move(levels);
  o.memory_limit_bytes = memory;
  return o;
}

int total_replicas(const Partition& part) {
  int n = 0;
  for (const StagePlan& s : part.stages) n += s.replicas;
  return n;
}

// Checks one instance against the brute force; returns true if it was feasible.
bool check_pipedream(const Profile& prof, const std::vector<Level>& levels, double memory) {
  const int L = static_cast<int>(prof.layers.size());
  BrutePipeDream brute(prof, levels, memory);
  double best = brute.best(static_cast<int>(levels.size()) - 1, 0, L - 1);
  if (!std::isfinite(best)) {
    EXPECT_THROW(make_partition(prof, pipedream(levels, memory)), UserError);
    return false;
  }
  Partition part = make_partition(prof, pipedream(levels, memory));
  EXPECT_TRUE(near(part.time_per_minibatch_s, best)) << part.time_per_minibatch_s << " vs " << best;
  EXPECT_NO_THROW(check_partition(part, L));
  int workers = 1;
  for (const Level& l : levels) workers *= l.workers;
  EXPECT_EQ(total_replicas(part), workers);
  for (const StagePlan& s : part.stages) {
    EXPECT_TRUE(
        near(s.compute_s, direct_compute_s(prof, s.first_layer, s.last_layer) / s.replicas));
  }
  if (levels.size() == 1) {  // the stages it returns achieve the time it reports
    EXPECT_TRUE(near(brute.flat_time(part.stages), part.time_per_minibatch_s));
  }
  EXPECT_TRUE(near(part.speedup_vs_single, direct_compute_s(prof, 0, L - 1) / best));
  return true;
}

TEST(PipeDreamPartition, FlatAgreesWithBruteForce) {
  std::mt19937 rng(3);
  int feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int L = 1 + trial % 6;
    int N = 1 + static_cast<int>(rng() % 5);
    double bw = std::vector<double>{5e8, 1e9, 1e10, 1e11}[rng() % 4];
    double memory = trial % 4 == 3 ? 40e6 + (rng() % 8) * 20e6 : 0;
    Profile prof = random_profile(rng, L);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " L=" << L << " N=" << N
                                      << " bw=" << bw << " memory=" << memory);
    feasible += check_pipedream(prof, {{N, bw}}, memory);
  }
  EXPECT_GT(feasible, 250);  // the memory limit binds sometimes, not always
}

TEST(PipeDreamPartition, HierarchicalAgreesWithBruteForce) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 150; ++trial) {
    int L = 1 + trial % 5;
    int inner = 1 + static_cast<int>(rng() % 3), outer = 1 + static_cast<int>(rng() % 3);
    double fast = std::vector<double>{1e10, 1e11}[rng() % 2];
    double slow = std::vector<double>{5e8, 1e9}[rng() % 2];
    double memory = trial % 5 == 4 ? 60e6 + (rng() % 8) * 20e6 : 0;
    Profile prof = random_profile(rng, L);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " L=" << L << " levels " << inner
                                      << "x" << outer << " memory=" << memory);
    check_pipedream(prof, {{inner, fast}, {outer, slow}}, memory);
  }
  // Three levels, a few times.
  for (int trial = 0; trial < 20; ++trial) {
    Profile prof = random_profile(rng, 1 + trial % 4);
    check_pipedream(prof, {{2, 1e11}, {2, 1e10}, {2, 1e9}}, 0);
  }
}

TEST(PipeDreamPartition, ReplicatesCheapWeightsAndPipelinesHeavyOnes) {
  // Layer 0: 100 ms of compute and no weights; layer 1: 1 ms and 1 GB of weights. Syncing layer
  // 1 across workers would cost seconds, so it stays on one worker; layer 0 takes the rest.
  Profile p;
  p.layers.push_back({"conv", 50, 50, 0, 1e3, 1e3, 0});
  p.layers.push_back({"fc", 0.5, 0.5, 0, 1e3, 1e3, 1e9});
  Partition part = make_partition(p, pipedream({{4, 1e9}}));
  ASSERT_EQ(part.stages.size(), 2u);
  EXPECT_EQ(part.stages[0].replicas, 3);
  EXPECT_EQ(part.stages[1].replicas, 1);
  EXPECT_NEAR(part.time_per_minibatch_s, 0.100 / 3, 1e-12);
  EXPECT_NEAR(part.speedup_vs_single, 0.101 / (0.100 / 3), 1e-9);
}

// ---- the shipped PipeDream profiles -----------------------------------------------------

TEST(ShippedProfiles, TimeIsOptimalAndBeatsUniform) {
  for (const char* model : {"alexnet", "vgg16", "resnet50", "gnmt"}) {
    SCOPED_TRACE(model);
    Profile prof = read_profile(testing::shipped_graph(model));
    const int L = static_cast<int>(prof.layers.size());
    double total = direct_compute_s(prof, 0, L - 1);
    for (int P : {2, 3, 4, 8}) {
      Partition time = make_partition(prof, unreplicated("time", P));
      Partition uniform = make_partition(prof, unreplicated("uniform", P));
      expect_contiguous(time, L, P);
      EXPECT_GE(time.time_per_minibatch_s, total / P - 1e-12);
      EXPECT_LE(time.time_per_minibatch_s, uniform.time_per_minibatch_s + 1e-12);
      if (P <= 3) {
        double best =
            brute_min_max(L, P, [&](int i, int j) { return direct_compute_s(prof, i, j); });
        EXPECT_TRUE(near(time.time_per_minibatch_s, best));
      }
    }
  }
}

TEST(ShippedProfiles, PipeDreamUsesEveryWorkerAndBeatsPlainDataParallel) {
  for (const char* model : {"alexnet", "vgg16", "resnet50", "gnmt"}) {
    SCOPED_TRACE(model);
    Profile prof = read_profile(testing::shipped_graph(model));
    const int L = static_cast<int>(prof.layers.size());
    double total = direct_compute_s(prof, 0, L - 1), params = direct_params(prof, 0, L - 1);
    for (int N : {1, 2, 4, 8}) {
      Partition part = make_partition(prof, pipedream({{N, kDefaultBandwidthBytesPerS}}));
      EXPECT_EQ(total_replicas(part), N);
      // Plain data parallelism (one stage on all N workers) is one of the candidates.
      double data_parallel = (total + 4.0 * (N - 1) * params / (1e9 * N)) / N;
      EXPECT_LE(part.time_per_minibatch_s, data_parallel + 1e-12);
      EXPECT_GE(part.speedup_vs_single, 1.0 - 1e-12);
      EXPECT_LE(part.speedup_vs_single, N + 1e-9);
    }
  }
}

TEST(ShippedProfiles, Vgg16OnFourWorkersPipelinesTheClassifier) {
  // VGG16's three Linear layers hold 89% of its weights but ~3% of its compute: PipeDream puts
  // them on one worker and replicates the convolutions (the paper's "15-1" on 16 GPUs).
  Profile prof = read_profile(testing::shipped_graph("vgg16"));
  Partition part = make_partition(prof, pipedream({{4, kDefaultBandwidthBytesPerS}}));
  ASSERT_GE(part.stages.size(), 2u);
  const StagePlan& last = part.stages.back();
  EXPECT_EQ(last.replicas, 1);
  EXPECT_LT(last.first_layer, 33);  // before the first Linear (node35, chain position 33)
  EXPECT_GE(part.speedup_vs_single, 2.0);
}

TEST(ShippedProfiles, TwoLevelResNet50UsesAllSixteenWorkers) {
  Profile prof = read_profile(testing::shipped_graph("resnet50"));
  Partition part = make_partition(prof, pipedream({{4, 100e9}, {4, 1e9}}));
  EXPECT_EQ(total_replicas(part), 16);
  EXPECT_GT(part.speedup_vs_single, 4.0);
  EXPECT_NO_THROW(check_partition(part, static_cast<int>(prof.layers.size())));
}

// ---- options and JSON -------------------------------------------------------------------

TEST(MakePartition, RejectsImpossibleOptions) {
  std::mt19937 rng(1);
  Profile prof = random_profile(rng, 3);
  auto message = [&](const PartitionOptions& o) {
    try {
      make_partition(prof, o);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(unreplicated("time", 4)).find("cannot cut 3 layers into 4 stages"),
            std::string::npos);
  EXPECT_NE(message(unreplicated("time", 0)).find("stages >= 1, got 0"), std::string::npos);
  EXPECT_NE(message(unreplicated("greedy", 2)).find("unknown partition method 'greedy'"),
            std::string::npos);
  EXPECT_NE(message(pipedream({})).find("level"), std::string::npos);
  EXPECT_NE(message(pipedream({{0, 1e9}})).find("workers, got 0"), std::string::npos);
  EXPECT_NE(message(pipedream({{2, 0}})).find("bandwidth"), std::string::npos);
  EXPECT_NE(message(pipedream({{2, 1e9}}, 1)).find("memory limit of 1 bytes"), std::string::npos);
  PartitionOptions with_memory = unreplicated("time", 2);
  with_memory.memory_limit_bytes = 1e9;
  EXPECT_NE(message(with_memory).find("pipedream"), std::string::npos);
  EXPECT_THROW(make_partition(Profile{}, unreplicated("time", 1)), UserError);
}

TEST(PartitionJson, RoundTrips) {
  std::mt19937 rng(9);
  Profile prof = random_profile(rng, 6);
  Partition part = make_partition(prof, pipedream({{3, 1e9}}));
  Partition back = parse_partition_json(to_json(part));
  EXPECT_EQ(back.method, "pipedream");
  ASSERT_EQ(back.stages.size(), part.stages.size());
  for (size_t s = 0; s < part.stages.size(); ++s) {
    EXPECT_EQ(back.stages[s].first_layer, part.stages[s].first_layer);
    EXPECT_EQ(back.stages[s].last_layer, part.stages[s].last_layer);
    EXPECT_EQ(back.stages[s].replicas, part.stages[s].replicas);
    EXPECT_EQ(back.stages[s].compute_s, part.stages[s].compute_s);  // exact: JSON keeps 17 digits
  }
  EXPECT_EQ(back.time_per_minibatch_s, part.time_per_minibatch_s);
  EXPECT_EQ(back.speedup_vs_single, part.speedup_vs_single);
}

TEST(PartitionJson, AHandWrittenFileNeedsOnlyTheRanges) {
  Partition p = parse_partition_json(
      R"({"stages": [{"first_layer": 0, "last_layer": 1}, {"first_layer": 2, "last_layer": 4}]})");
  EXPECT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[1].replicas, 1);
  EXPECT_NO_THROW(check_partition(p, 5));
  EXPECT_THROW(check_partition(p, 6), UserError);
}

TEST(PartitionJson, RejectsBadFiles) {
  auto message = [](const std::string& text) {
    try {
      parse_partition_json(text);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[1, 2]").find("'stages'"), std::string::npos);
  EXPECT_NE(
      message(
          R"({"stages": [{"first_layer": 0, "last_layer": 1}, {"first_layer": 3, "last_layer": 4}]})")
          .find("stage 1: first_layer must be 2"),
      std::string::npos);
  EXPECT_NE(message(R"({"stages": [{"first_layer": 0}]})").find("missing field 'last_layer'"),
            std::string::npos);
  EXPECT_NE(message(R"({"stages": [{"first_layer": 0, "last_layer": 1, "replicas": 0}]})")
                .find("replicas"),
            std::string::npos);
  EXPECT_NE(message(R"({"stages": [{"first_layer": 0, "last_layer": "x"}]})").find("integer"),
            std::string::npos);
  EXPECT_NE(message("{").find("JSON"), std::string::npos);
}

TEST(StageTime, IsTheTimeCostOfOneStage) {
  Profile p;
  p.layers.push_back({"a", 1, 2, 1, 4e6, 0, 0});
  p.layers.push_back({"b", 3, 3, 0, 8e6, 0, 0});
  EXPECT_DOUBLE_EQ(stage_time_s(p, 0, 1, 0), 0.010);
  EXPECT_DOUBLE_EQ(stage_time_s(p, 1, 1, 0), 0.006);
  EXPECT_DOUBLE_EQ(stage_time_s(p, 1, 1, 1e9), 0.008);  // receives 4 MB, returns 4 MB at 1 GB/s
  EXPECT_THROW(stage_time_s(p, 1, 2, 0), UserError);
}

}  // namespace
}  // namespace pptrain
