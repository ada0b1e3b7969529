#include "pptrain/render/chrome_trace.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

Timeline two_rank_timeline() {
  return Timeline{"1f1b, P=2, M=1",
                  2,
                  {{0, Action::make(Op::F, 0, 0), 0, 1},
                   {0, Action::make(Op::SEND_F, 0, 0), 1, 1.5},
                   {1, Action::make(Op::F, 1, 0), 1.5, 2.5},
                   {1, Action::make(Op::B, 1, 0), 2.5, 4.5},
                   {0, Action::make(Op::B, 0, 0), 5, 7}}};
}

TEST(ChromeTrace, OneCompleteEventPerActionAndOneThreadNamePerRank) {
  const auto trace = nlohmann::json::parse(render_chrome_trace(two_rank_timeline()));
  ASSERT_TRUE(trace.contains("traceEvents"));
  int complete = 0, thread_names = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_EQ(e["pid"], 0);
      EXPECT_TRUE(e.contains("name") && e.contains("tid") && e.contains("ts") && e.contains("dur"));
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(e["tid"].get<int>()));
      ++thread_names;
    }
  }
  EXPECT_EQ(complete, 5);
  EXPECT_EQ(thread_names, 2);
}

TEST(ChromeTrace, ScalesTimesToMicroseconds) {
  Timeline measured = two_rank_timeline();
  measured.unit = TimeUnit::kSeconds;
  const auto trace = nlohmann::json::parse(render_chrome_trace(measured));
  bool found = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["name"] != "1B0") continue;
    found = true;
    EXPECT_EQ(e["tid"], 1);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 2.5e6);
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2e6);
    EXPECT_EQ(e["cat"], "B");
    EXPECT_EQ(e["args"]["stage"], 1);
    EXPECT_EQ(e["args"]["microbatch"], 0);
  }
  EXPECT_TRUE(found);
  // A simulated timeline's cost unit shows as one millisecond.
  const auto simulated = nlohmann::json::parse(render_chrome_trace(two_rank_timeline()));
  for (const auto& e : simulated["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "1B0") {
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 2500);
    }
  }
}

TEST(ChromeTrace, ReductionsOnATrackOfTheirOwnBelowTheirRank) {
  Timeline t = two_rank_timeline();
  t.events.push_back({0, parse_action("0REDUCE_GRAD"), 7, 8.5});
  const auto trace = nlohmann::json::parse(render_chrome_trace(t));
  std::map<int, std::string> names;
  std::map<int, int> sort_index;
  bool found = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_sort_index")
      sort_index[e["tid"]] = e["args"]["sort_index"];
    if (e["ph"] != "X" || e["name"] != "0REDUCE_GRAD") continue;
    found = true;
    EXPECT_EQ(e["tid"], 2);  // num_ranks + rank
    EXPECT_EQ(e["cat"], "all-reduce");
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1500);
    EXPECT_EQ(e["args"]["stage"], 0);
    EXPECT_FALSE(e["args"].contains("microbatch"));
  }
  EXPECT_TRUE(found);
  // Rank 1 has no reductions, so no track for them; rank 0's sits between rank 0 and rank 1.
  EXPECT_EQ(names,
            (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}, {2, "rank 0 all-reduce"}}));
  EXPECT_LT(sort_index[0], sort_index[2]);
  EXPECT_LT(sort_index[2], sort_index[1]);
}

}  // namespace
}  // namespace pptrain
