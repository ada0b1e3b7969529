#include "pptrain/planner/planner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/common/testing.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/testing.h"
#include "pptrain/planner/plan_file.h"
#include "pptrain/schedule/semantics.h"
#include "pptrain/sim/cost_model.h"

namespace pptrain {
namespace {

using testing::user_error_of;

// 8 layers of uneven cost: a heavy middle, a large first-layer parameter block.
Profile small_profile() {
  Profile p;
  p.source = "<test>";
  for (int l = 0; l < 8; ++l) {
    LayerProfile layer;
    layer.name = "layer" + std::to_string(l);
    layer.forward_ms = 1 + (l % 3);
    layer.backward_input_ms = 1 + (l % 2);
    layer.backward_weight_ms = 1;
    layer.activation_bytes = 1000;
    layer.stash_bytes = 4000 + 1000 * l;
    layer.parameter_bytes = l == 0 ? 20000 : 5000;
    p.layers.push_back(layer);
  }
  return p;
}

PlannerOptions small_options() {
  PlannerOptions o;
  o.workers = 2;
  o.batch_size = 8;
  o.microbatches = {2, 4, 8};
  o.max_chunks = 2;
  o.keep = 1000;
  return o;
}

// A candidate on the given cut, not yet evaluated.
Candidate candidate_of(const std::string& schedule, int chunks, int microbatches, bool recompute,
                       const std::vector<LayerRange>& stage_layers) {
  Candidate c;  // figures 0, microbatch size evaluate()'s
  c.stage_layers = stage_layers;
  c.schedule = schedule;
  c.chunks = chunks;
  c.microbatches = microbatches;
  c.recompute = recompute;
  return c;
}

// Every candidate of the search, evaluated one by one without the search's shared schedules.
std::vector<Candidate> brute_force(const Profile& profile, const PlannerOptions& o) {
  std::vector<Candidate> out;
  for (int M : o.microbatches) {
    for (const std::string& name : synchronous_schedules()) {
      const ScheduleEntry& entry = find_schedule(name);
      const int most =
          entry.max_chunks == 0 ? o.max_chunks : std::min(entry.max_chunks, o.max_chunks);
      for (int V = entry.min_chunks; V <= std::max(most, entry.min_chunks); ++V) {
        std::vector<std::vector<LayerRange>> seen;
        for (const char* method : {"uniform", "params", "time"}) {
          PartitionOptions request;
          request.method = method;
          request.stages = o.workers * V;
          std::vector<LayerRange> ranges;
          for (const StagePlan& s : make_partition(profile, request).stages) {
            ranges.emplace_back(s.first_layer, s.last_layer);
          }
          if (std::find(seen.begin(), seen.end(), ranges) != seen.end()) continue;
          seen.push_back(ranges);
          for (bool recompute : {false, true}) {
            Candidate c = candidate_of(name, V, M, recompute, ranges);
            try {
              evaluate(profile, o, c);
            } catch (const UserError&) {
              continue;
            }
            out.push_back(c);
          }
        }
      }
    }
  }
  return out;
}

TEST(Planner, SearchMatchesBruteForce) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.partitions = {"uniform", "params", "time"};
  const std::vector<Candidate> unlimited = brute_force(profile, o);
  ASSERT_FALSE(unlimited.empty());
  // A limit halfway between the smallest and the largest peak drops some candidates.
  double low = unlimited[0].max_peak_bytes(), high = low;
  for (const Candidate& c : unlimited) {
    low = std::min(low, c.max_peak_bytes());
    high = std::max(high, c.max_peak_bytes());
  }
  ASSERT_LT(low, high);
  o.memory_limit_bytes = (low + high) / 2;
  // zb-auto plans under the limit: evaluate again with it.
  const std::vector<Candidate> all = brute_force(profile, o);
  std::vector<double> fitting_times;
  const double planned_under = o.memory_limit_bytes * (1 - o.memory_margin);
  for (const Candidate& c : all) {
    if (c.max_peak_bytes() <= planned_under) fitting_times.push_back(c.step_ms);
  }
  std::sort(fitting_times.begin(), fitting_times.end());

  const PlanSearch search = search_plans(profile, o);
  EXPECT_EQ(search.evaluated, static_cast<int>(all.size()));
  ASSERT_EQ(search.ranked.size(), fitting_times.size());
  for (size_t i = 0; i < fitting_times.size(); ++i) {
    EXPECT_DOUBLE_EQ(search.ranked[i].step_ms, fitting_times[i]) << "rank " << i;
    EXPECT_LE(search.ranked[i].max_peak_bytes(), planned_under);
  }
  double smallest = all[0].max_peak_bytes();
  for (const Candidate& c : all) smallest = std::min(smallest, c.max_peak_bytes());
  EXPECT_DOUBLE_EQ(search.smallest.max_peak_bytes(), smallest);
}

// Any number of threads gives the serial search's result, candidate for candidate.
TEST(Planner, ThreadsChangeNothing) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.memory_limit_bytes = 400000;
  o.jobs = 1;
  const PlanSearch serial = search_plans(profile, o);
  ASSERT_GT(serial.ranked.size(), 3u);
  EXPECT_LT(serial.simulated, serial.evaluated);  // some above the limit, not simulated
  for (int jobs : {2, 3, 0}) {
    o.jobs = jobs;
    const PlanSearch threaded = search_plans(profile, o);
    EXPECT_EQ(threaded.evaluated, serial.evaluated) << jobs;
    EXPECT_EQ(threaded.simulated, serial.simulated) << jobs;
    EXPECT_EQ(threaded.fitting, serial.fitting) << jobs;
    ASSERT_EQ(threaded.ranked.size(), serial.ranked.size()) << jobs;
    for (size_t i = 0; i < serial.ranked.size(); ++i) {
      const Candidate &a = serial.ranked[i], &b = threaded.ranked[i];
      EXPECT_EQ(a.schedule, b.schedule) << jobs << " #" << i;
      EXPECT_EQ(a.partition, b.partition) << jobs << " #" << i;
      EXPECT_EQ(a.microbatches, b.microbatches) << jobs << " #" << i;
      EXPECT_EQ(a.chunks, b.chunks) << jobs << " #" << i;
      EXPECT_EQ(a.recompute, b.recompute) << jobs << " #" << i;
      EXPECT_EQ(a.step_ms, b.step_ms) << jobs << " #" << i;
      EXPECT_EQ(a.peak_bytes, b.peak_bytes) << jobs << " #" << i;
    }
    EXPECT_EQ(threaded.smallest.peak_bytes, serial.smallest.peak_bytes) << jobs;
  }
  o.jobs = -1;
  EXPECT_THROW(search_plans(profile, o), UserError);
}

// A zb-auto candidate of the search keeps the schedule planned for it, and evaluate() takes it:
// the same schedule, figures and timeline as planning it again (under limits from none to one
// where the memory model makes zb-auto plan again, or keep a fixed order).
TEST(Planner, SearchedZbAutoEvaluatesAsPlanningItAgain) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.schedules = {"zb-auto"};
  o.keep = 1000;
  int compared = 0;
  for (double limit : {0.0, 400000.0, 300000.0}) {
    o.memory_limit_bytes = limit;
    PlanSearch search;
    try {
      search = search_plans(profile, o);
    } catch (const UserError&) {
      continue;  // nothing fits this one
    }
    for (const Candidate& searched : search.ranked) {
      ASSERT_NE(searched.made, nullptr);
      Candidate kept = searched, again = searched;
      again.made = nullptr;
      const Evaluation a = evaluate(profile, o, kept), b = evaluate(profile, o, again);
      EXPECT_EQ(a.schedule.actions, b.schedule.actions);
      EXPECT_EQ(a.schedule.name, b.schedule.name);
      EXPECT_EQ(kept.step_ms, again.step_ms);
      EXPECT_EQ(kept.step_ms, searched.step_ms);
      EXPECT_EQ(kept.peak_bytes, again.peak_bytes);
      ASSERT_EQ(a.sim.timeline.events.size(), b.sim.timeline.events.size());
      EXPECT_GT(a.sim.timeline.events.size(), 0u);
      for (size_t e = 0; e < a.sim.timeline.events.size(); ++e) {
        const TimelineEvent &x = a.sim.timeline.events[e], &y = b.sim.timeline.events[e];
        EXPECT_TRUE(x.rank == y.rank && x.action == y.action && x.start == y.start &&
                    x.end == y.end)
            << "event " << e;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 10);
}

TEST(Planner, TighterLimitNeverPicksAboveIt) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.keep = 1;
  o.memory_limit_bytes = 0;
  PlanSearch unlimited = search_plans(profile, o);
  double previous_ms = unlimited.ranked.front().step_ms;
  double limit = unlimited.ranked.front().max_peak_bytes();
  for (int i = 0; i < 12; ++i) {
    o.memory_limit_bytes = limit;
    PlanSearch s;
    try {
      s = search_plans(profile, o);
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("smallest peak"), std::string::npos) << e.what();
      break;
    }
    const Candidate& best = s.ranked.front();
    EXPECT_LE(best.max_peak_bytes(), limit);
    EXPECT_GE(best.step_ms, previous_ms);  // less memory never buys a faster step
    previous_ms = best.step_ms;
    limit = best.max_peak_bytes() * 0.9;
  }
}

// A candidate's peak is the memory model's on its lowered schedule, with each stage's bytes from
// the profile scaled to the microbatch, and its activations the simulator's.
TEST(Planner, PeakIsTheMemoryModelsOnTheLoweredSchedule) {
  Profile profile = small_profile();
  profile.input_bytes = 100;
  profile.target_bytes = 300;
  profile.layers[2].backward_transient_bytes = 700;
  profile.layers[2].backward_transient_fixed_bytes = 300;  // does not grow with the samples
  profile.layers[5].forward_transient_bytes = 900;
  PlannerOptions o = small_options();
  Candidate c;
  c.schedule = "1f1b";
  c.microbatches = 4;  // microbatches of 2 samples: twice the profiled one
  c.stage_layers = {{0, 3}, {4, 7}};
  const Evaluation e = evaluate(profile, o, c);

  std::vector<StageBytes> stages(2);
  stages[0].weights = 35000;
  stages[1].weights = 20000;
  for (StageBytes& s : stages) s.optimizer_state = 2 * s.weights;  // AdamW: two moments
  // Stage 1 also holds its input, the message from stage 0 (layer 3's activation bytes).
  stages[0].activation = 2 * (4000 + 5000 + 6000 + 7000);
  stages[1].activation = 2 * (profile.layers[3].activation_bytes + 8000 + 9000 + 10000 + 11000);
  stages[1].weight_stash = 2 * o.mem_w_ratio * (8000 + 9000 + 10000 + 11000);
  stages[0].weight_stash = 2 * o.mem_w_ratio * (4000 + 5000 + 6000 + 7000);
  stages[1].message = 2 * profile.layers[3].activation_bytes;
  stages[0].transient = 300 + 2 * (700 - 300);
  stages[1].forward_transient = 2 * 900;
  stages[0].data = 4 * 2 * 100;  // M microbatches of inputs, and of targets
  stages[1].data = 4 * 2 * 300;
  const ValidatedSchedule lowered = validate(lower(make_schedule({"1f1b", 2, 4})));
  const std::vector<RankMemory> want = predict_memory(lowered, stages);
  Profile doubled = profile;
  for (LayerProfile& l : doubled.layers) {
    l.forward_ms *= 2, l.backward_input_ms *= 2, l.backward_weight_ms *= 2;
  }
  const SimResult sim = simulate(validate(make_schedule({"1f1b", 2, 4})),
                                 cost_from_profile(doubled, c.stage_layers, 1));
  EXPECT_DOUBLE_EQ(c.step_ms, sim.makespan);
  ASSERT_EQ(e.memory.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_DOUBLE_EQ(c.peak_bytes[r], want[r].total()) << "rank " << r;
    EXPECT_DOUBLE_EQ(e.memory[r].messages, want[r].messages) << "rank " << r;
    EXPECT_DOUBLE_EQ(e.memory[r].activations, e.sim.ranks[r].peak_activations) << "rank " << r;
  }
  EXPECT_GT(want[1].messages, 0);
  EXPECT_DOUBLE_EQ(want[0].data, 800);
  EXPECT_GT(want[0].transient + want[1].transient, 0);  // the working memory counted
}

TEST(Planner, RecomputationTradesTimeForMemory) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  Candidate keep, rerun;
  keep.schedule = rerun.schedule = "gpipe";
  keep.microbatches = rerun.microbatches = 8;
  keep.stage_layers = rerun.stage_layers = {{0, 3}, {4, 7}};
  rerun.recompute = true;
  evaluate(profile, o, keep);
  evaluate(profile, o, rerun);
  EXPECT_GT(rerun.step_ms, keep.step_ms);
  EXPECT_LT(rerun.max_peak_bytes(), keep.max_peak_bytes());
}

// The shipped PipeDream profiles on 2, 4 and 8 workers, from the smallest limit that fits 1F1B
// up to none: zb-auto is never slower than 1F1B, nor than ZB-H1 and ZB-H2 where they fit, on the
// same cut, M and recomputation (the zero-bubble paper's ZB-1p argument: I right before its W is
// 1F1B's order with 1F1B's memory). With W free (w_fraction 0) and at the paper's I = W.
TEST(Planner, ZbAutoNeverSlowerThanTheFixedSchedulesThatFitOnShippedProfiles) {
  int compared = 0, zb_faster = 0;
  for (const char* model : {"alexnet", "vgg16", "resnet50", "gnmt"}) {
    const Profile profile = read_profile(testing::shipped_graph(model));
    for (int P : {2, 4, 8}) {
      PartitionOptions cut;
      cut.method = "time";
      cut.stages = P;
      std::vector<LayerRange> ranges;
      for (const StagePlan& stage : make_partition(profile, cut).stages) {
        ranges.emplace_back(stage.first_layer, stage.last_layer);
      }
      for (double w_fraction : {0.0, 0.5}) {
        for (int M : {P, 16}) {
          for (bool recompute : {false, true}) {
            PlannerOptions o;
            o.workers = P;
            o.batch_size = 16;
            o.memory_margin = 0;  // limits between the fixed schedules' own peaks
            o.w_fraction = w_fraction;
            const auto run = [&](const std::string& name, double limit) {
              Candidate c = candidate_of(name, 1, M, recompute, ranges);
              o.memory_limit_bytes = limit;
              evaluate(profile, o, c);
              return c;
            };
            const Candidate one_f_one_b = run("1f1b", 0), h1 = run("zb-h1", 0),
                            h2 = run("zb-h2", 0), free = run("zb-auto", 0);
            // Five limits from 1F1B's peak up to the most any of them holds, then none.
            const double low = one_f_one_b.max_peak_bytes();
            const double high = std::max({low, h2.max_peak_bytes(), free.max_peak_bytes()});
            std::vector<double> limits;
            for (int k = 0; k < 5; ++k) limits.push_back(low * std::pow(high / low, k / 4.0));
            limits.push_back(0);
            for (double limit : limits) {
              SCOPED_TRACE(std::string(model) + " P=" + std::to_string(P) + " M=" +
                           std::to_string(M) + (recompute ? " recompute" : "") + " w_fraction " +
                           std::to_string(w_fraction) + " limit " + std::to_string(limit));
              const Candidate autos = run("zb-auto", limit);
              if (limit > 0) {
                EXPECT_LE(autos.max_peak_bytes(), limit * (1 + 1e-9));
              }
              for (const Candidate* fixed : {&one_f_one_b, &h1, &h2}) {
                if (limit > 0 && fixed->max_peak_bytes() > limit) continue;
                ++compared;
                EXPECT_LE(autos.step_ms, fixed->step_ms * (1 + 1e-9)) << fixed->schedule;
              }
              zb_faster += autos.step_ms < one_f_one_b.step_ms * (1 - 1e-6);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(zb_faster, 100);  // and it does buy something
}

// Equal workers given as speeds of 1 plan exactly as without them; a rank at a third of the
// speed gets fewer layers in the winner, and its predicted step is the simulation of its stage
// times divided by the ranks' speeds.
TEST(Planner, UnequalWorkersGiveTheSlowRankLess) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.jobs = 1;
  const PlanSearch equal = search_plans(profile, o);
  o.rank_speeds = {1.0, 1.0};
  const PlanSearch ones = search_plans(profile, o);
  ASSERT_EQ(ones.ranked.size(), equal.ranked.size());
  for (size_t i = 0; i < equal.ranked.size(); ++i) {
    EXPECT_EQ(ones.ranked[i].stage_layers, equal.ranked[i].stage_layers) << i;
    EXPECT_EQ(ones.ranked[i].step_ms, equal.ranked[i].step_ms) << i;
  }
  o.rank_speeds = {1.0, 1.0 / 3};
  o.schedules = {"1f1b"};
  o.max_chunks = 1;
  const PlanSearch slow = search_plans(profile, o);
  const Candidate& best = slow.ranked.front();
  const int first = best.stage_layers[0].second - best.stage_layers[0].first + 1;
  const int second = best.stage_layers[1].second - best.stage_layers[1].first + 1;
  EXPECT_GT(first, second) << best.partition;
  Candidate again = best;
  const Evaluation e = evaluate(profile, o, again);
  EXPECT_DOUBLE_EQ(again.step_ms, best.step_ms);
  // Rank 1's F is three times its stage's profiled F.
  double forward_ms = 0;
  for (int l = best.stage_layers[1].first; l <= best.stage_layers[1].second; ++l) {
    forward_ms += profile.layers[l].forward_ms * best.microbatch_size;  // profiled for 1 sample
  }
  EXPECT_NEAR(e.cost.stage_forward[1], 3 * forward_ms, 1e-9 * forward_ms);
  // Slower than the equal workers' best, faster than the equal cut on these workers.
  EXPECT_GT(best.step_ms, equal.ranked.front().step_ms);
  Candidate even = candidate_of("1f1b", 1, best.microbatches, best.recompute, {{0, 3}, {4, 7}});
  evaluate(profile, o, even);
  EXPECT_LT(best.step_ms, even.step_ms);
  // Chimera runs each stage on both ranks (one per direction): every stage at the slower speed.
  Candidate both = candidate_of("chimera", 1, 4, false, {{0, 3}, {4, 7}});
  const Evaluation slowest = evaluate(profile, o, both);
  o.rank_speeds = {};
  Candidate equal_both = candidate_of("chimera", 1, 4, false, {{0, 3}, {4, 7}});
  const Evaluation equal_speeds = evaluate(profile, o, equal_both);
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(slowest.cost.stage_forward[s], 3 * equal_speeds.cost.stage_forward[s], 1e-9) << s;
  }
}

// --dp 2: the search plans one copy on half the batch (equal workers: exactly the one-pipeline
// search, no shares); on unequal workers each pipeline rank at its slowest copy's speed, and the
// copies take shares for their own paces: a copy on two half-speed ranks takes a quarter of the
// batch (a third would end a step later in whole microbatches of 2), and with speeds 1, 1, 1,
// 0.33 on the uniform cut the slow copy takes less. Equal speeds keep equal shares.
TEST(Planner, DataParallelCopiesTakeSharesForTheirPaces) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.jobs = 1;
  o.schedules = {"1f1b", "zb-h1", "zb-v"};
  const PlanSearch one = search_plans(profile, o);
  o.copies = 2;
  o.batch_size = 16;
  const PlanSearch two = search_plans(profile, o);
  EXPECT_EQ(two.batch_size, 8);
  ASSERT_EQ(two.ranked.size(), one.ranked.size());
  for (size_t i = 0; i < one.ranked.size(); ++i) {
    EXPECT_EQ(two.ranked[i].stage_layers, one.ranked[i].stage_layers) << i;
    EXPECT_EQ(two.ranked[i].step_ms, one.ranked[i].step_ms) << i;
    EXPECT_TRUE(two.ranked[i].dp_shares.empty()) << i;
  }
  o.microbatches = {2};
  o.rank_speeds = {1, 1, 1, 1};
  for (const Candidate& c : search_plans(profile, o).ranked) EXPECT_TRUE(c.dp_shares.empty());
  o.rank_speeds = {1, 1, 0.5, 0.5};
  for (const Candidate& c : search_plans(profile, o).ranked) {
    EXPECT_EQ(c.dp_shares, (std::vector<int>{12, 4})) << c.partition << " " << c.schedule;
  }
  EXPECT_EQ(dp_shares_for(profile, {{0, 3}, {4, 7}}, {0, 1}, {1, 1, 1, 0.33}, 16, 2).shares,
            (std::vector<int>{12, 4}));
  EXPECT_TRUE(dp_shares_for(profile, {{0, 3}, {4, 7}}, {0, 1}, {1, 1, 1, 1}, 16, 2).shares.empty());
  // The one copy planned: pipeline rank 1 at its slowest copy's speed.
  o.rank_speeds = {1, 1, 1, 0.33};
  EXPECT_EQ(one_copy(o).rank_speeds, (std::vector<double>{1, 0.33}));
  EXPECT_EQ(one_copy(o).batch_size, 8);
  o.batch_size = 15;
  EXPECT_NE(user_error_of([&] { search_plans(profile, o); }).find("is not a multiple of the 2"),
            std::string::npos);
  // Copies do not run a schedule whose stages are replicated already.
  o.batch_size = 16;
  o.schedules = {"chimera"};
  EXPECT_NE(user_error_of([&] { search_plans(profile, o); }).find("replicates its stages"),
            std::string::npos);
}

// A rank's own memory limit holds that rank only; one no plan fits names the rank and the
// smallest limit that works there.
TEST(Planner, PerRankMemoryLimits) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.jobs = 1;
  const PlanSearch unlimited = search_plans(profile, o);
  double smallest_rank1 = unlimited.ranked.front().peak_bytes[1];
  for (const Candidate& c : unlimited.ranked)
    smallest_rank1 = std::min(smallest_rank1, c.peak_bytes[1]);
  o.rank_memory_limits = {0, smallest_rank1 * 1.2};
  const PlanSearch limited = search_plans(profile, o);
  ASSERT_FALSE(limited.ranked.empty());
  bool placed = false;
  for (const Candidate& c : limited.ranked) {
    // The pipeline rank worker 1 runs (the search also tries it on rank 0).
    const size_t rank = c.placement.empty() ? 1 : c.placement[0] == 1 ? 0 : 1;
    placed = placed || !c.placement.empty();
    EXPECT_LE(c.peak_bytes[rank], smallest_rank1 * 1.2 * (1 - o.memory_margin) * (1 + 1e-9));
  }
  EXPECT_TRUE(placed) << "no candidate runs worker 1 on rank 0";
  o.rank_memory_limits = {0, smallest_rank1 / 2};
  try {
    search_plans(profile, o);
    FAIL() << "no plan should fit";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no plan fits rank 1's memory limit"), std::string::npos) << message;
    EXPECT_NE(message.find("the smallest limit that works on rank 1 is"), std::string::npos)
        << message;
  }
  o.rank_memory_limits = {0, 0, 0};
  EXPECT_THROW(search_plans(profile, o), UserError);
  o.rank_memory_limits = {};
  o.rank_speeds = {1.0, 0.0};
  EXPECT_THROW(search_plans(profile, o), UserError);
}

// The planner chooses which worker runs which pipeline rank: a worker whose limit is below what
// rank r needs at least runs the other rank, where it fits. Equal workers are one placement.
TEST(Planner, PlacementPutsASmallLimitWhereItFits) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.jobs = 1;
  o.schedules = {"1f1b"};
  const PlanSearch unlimited = search_plans(profile, o);
  std::vector<double> least = unlimited.ranked.front().peak_bytes;  // [rank] over candidates
  for (const Candidate& c : unlimited.ranked) {
    for (int r = 0; r < 2; ++r) least[r] = std::min(least[r], c.peak_bytes[r]);
  }
  ASSERT_NE(least[0], least[1]);
  // The worker with the limit fits only the rank that needs less.
  const int roomy_rank = least[0] < least[1] ? 0 : 1;
  const double limit = least[roomy_rank] / (1 - o.memory_margin);
  o.rank_memory_limits =
      roomy_rank == 0 ? std::vector<double>{0, limit} : std::vector<double>{limit, 0};
  const PlanSearch placed = search_plans(profile, o);
  for (const Candidate& c : placed.ranked) {
    EXPECT_EQ(c.placement, (std::vector<int>{1, 0}));
    Candidate again = c;
    EXPECT_EQ(evaluate(profile, o, again).peak_bytes, c.peak_bytes);  // evaluate() places it too
  }
  EXPECT_EQ(distinct_placements(3, {1, 1, 1}, {}).size(), 1u);
  EXPECT_EQ(distinct_placements(3, {1, 0.5, 1}, {}).size(), 3u);
  EXPECT_EQ(distinct_placements(3, {1, 0.5, 1}, {}).front(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(distinct_placements(4, {1, 0.5, 0.3, 0.2}, {}).size(), 24u);
}

TEST(Planner, BadOptionsAreUserErrors) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.microbatches = {3};
  EXPECT_THROW(search_plans(profile, o), UserError);  // 3 does not divide 8
  o = small_options();
  o.schedules = {"pipedream"};
  EXPECT_THROW(search_plans(profile, o), UserError);  // asynchronous
  o = small_options();
  o.workers = 0;
  EXPECT_THROW(search_plans(profile, o), UserError);
  o = small_options();
  o.memory_limit_bytes = 1;
  try {
    search_plans(profile, o);
    FAIL() << "a 1-byte limit fits nothing";
  } catch (const UserError& e) {
    // The smallest limit that works and the rank that needs it: rank 0 holds the first layer's
    // large parameter block.
    const std::string message = e.what();
    EXPECT_NE(message.find("smallest peak"), std::string::npos) << message;
    EXPECT_NE(message.find(" bytes, on rank 0: "), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(PlanFile, RoundTrip) {
  const Profile profile = small_profile();
  PlannerOptions o = small_options();
  o.keep = 3;
  const PlanSearch search = search_plans(profile, o);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pptrain_plan_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "plan.json").string();
  write_text_file(path, plan_json(profile, o, search), "plan file");
  const PlanFile plan = read_plan_file(path);
  const Candidate& best = search.ranked.front();
  EXPECT_EQ(plan.schedule, best.schedule);
  EXPECT_EQ(plan.workers, 2);
  EXPECT_EQ(plan.chunks, best.chunks);
  EXPECT_EQ(plan.microbatches, best.microbatches);
  EXPECT_EQ(plan.batch_size, 8);
  EXPECT_EQ(plan.recompute, best.recompute);
  EXPECT_EQ(plan.stage_layers, best.stage_layers);
  EXPECT_EQ(plan.schedule_file, (dir / "schedule.csv").string());
  const Partition partition = winner_partition(profile, best);
  EXPECT_NO_THROW(check_partition(parse_partition_json(to_json(partition)), 8));

  EXPECT_TRUE(plan.placement.empty());  // equal workers: no placement written, the identity read
  EXPECT_EQ(plan_json(profile, o, search).find("placement"), std::string::npos);
  PlanSearch placed = search;
  placed.ranked.front().placement = {1, 0};
  write_text_file(path, plan_json(profile, o, placed), "plan file");
  EXPECT_EQ(read_plan_file(path).placement, (std::vector<int>{1, 0}));

  // --dp copies: "dp", the batch over the copies, and the winner's shares when they are not
  // equal; none of them in a plan of one pipeline.
  EXPECT_EQ(plan.dp, 1);
  EXPECT_TRUE(plan.dp_shares.empty());
  EXPECT_EQ(plan_json(profile, o, search).find("\"dp"), std::string::npos);
  PlannerOptions copies = o;
  copies.copies = 2;
  PlanSearch shared = search;
  write_text_file(path, plan_json(profile, copies, shared), "plan file");
  EXPECT_EQ(read_plan_file(path).dp, 2);
  EXPECT_EQ(read_plan_file(path).batch_size, 16);
  EXPECT_TRUE(read_plan_file(path).dp_shares.empty());
  shared.ranked.front().dp_shares = {4 * best.microbatches, 12 * best.microbatches};
  shared.batch_size = 8 * best.microbatches;
  write_text_file(path, plan_json(profile, copies, shared), "plan file");
  EXPECT_EQ(read_plan_file(path).dp_shares,
            (std::vector<int>{4 * best.microbatches, 12 * best.microbatches}));
  shared.ranked.front().dp_shares = {4 * best.microbatches, 4 * best.microbatches};
  write_text_file(path, plan_json(profile, copies, shared), "plan file");
  EXPECT_NE(user_error_of([&] { read_plan_file(path); }).find("dp_shares sum to"),
            std::string::npos);

  write_text_file(path, "{\"format\": \"pptrain-plan-1\", \"workers\": 2}", "plan file");
  EXPECT_THROW(read_plan_file(path), UserError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pptrain
