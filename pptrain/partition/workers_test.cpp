#include "pptrain/partition/workers.h"

#include <gtest/gtest.h>

#include "pptrain/common/check.h"
#include "pptrain/common/testing.h"

namespace pptrain {
namespace {

using testing::user_error_of;

TEST(WorkersProfile, RoundTripsInAnyRankOrder) {
  const WorkersProfile read = parse_workers_profile(R"({"workers": [
      {"rank": 1, "speed": 0.25, "memory_limit_bytes": 8e9},
      {"rank": 0, "speed": 1}]})");
  ASSERT_EQ(read.size(), 2);
  EXPECT_EQ(read.speeds(), (std::vector<double>{1.0, 0.25}));
  EXPECT_EQ(read.memory_limits_bytes(), (std::vector<double>{0.0, 8e9}));
  EXPECT_FALSE(read.all_equal());
  const WorkersProfile again = parse_workers_profile(to_json(read));
  EXPECT_EQ(to_json(again), to_json(read));
  EXPECT_EQ(describe_workers(read)[1], "rank 1: speed 0.25, memory limit 7.5 GiB");
}

TEST(WorkersProfile, RelativeSpeedsDivideByTheFastest) {
  EXPECT_EQ(relative_speeds({300, 100, 600}), (std::vector<double>{0.5, 1.0 / 6, 1.0}));
  EXPECT_NE(user_error_of([] { relative_speeds({300, 0}); }).find("rank 1"), std::string::npos);
}

TEST(WorkersProfile, BadFilesAreOneLineErrorsNamingTheRank) {
  auto error = [](const std::string& text) {
    return user_error_of([&] { parse_workers_profile(text, "w.json"); });
  };
  EXPECT_NE(error("{").find("w.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error(R"({"layers": []})").find("'workers' array"), std::string::npos);
  EXPECT_NE(error(R"({"workers": []})").find("empty"), std::string::npos);
  EXPECT_EQ(error(R"({"workers": [{"rank": 0, "speed": 0}]})"),
            "w.json: rank 0: speed must be > 0, got 0");
  EXPECT_EQ(error(R"({"workers": [{"rank": 0, "speed": -2}]})"),
            "w.json: rank 0: speed must be > 0, got -2");
  EXPECT_NE(error(R"({"workers": [{"rank": 0}]})").find("missing field 'speed'"),
            std::string::npos);
  EXPECT_NE(error(R"({"workers": [{"rank": 0, "speed": 1}, {"rank": 0, "speed": 1}]})")
                .find("rank 0 appears twice"),
            std::string::npos);
  EXPECT_NE(error(R"({"workers": [{"rank": 2, "speed": 1}]})").find("not in 0..0"),
            std::string::npos);
  EXPECT_NE(error(R"({"workers": [{"rank": 0, "speed": "fast"}]})").find("must be a number"),
            std::string::npos);
  EXPECT_NE(error(R"({"workers": [{"rank": 0, "speed": 1, "memory_limit_bytes": -1}]})")
                .find("memory_limit_bytes must be >= 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"format": "pptrain-profile-1", "workers": [{"rank": 0, "speed": 1}]})")
                .find("expected \"pptrain-workers-1\""),
            std::string::npos);
}

TEST(WorkersProfile, CountMustMatchTheRun) {
  const WorkersProfile three = parse_workers_profile(
      R"({"workers": [{"rank": 0, "speed": 1}, {"rank": 1, "speed": 1}, {"rank": 2, "speed": 1}]})",
      "w.json");
  EXPECT_TRUE(three.all_equal());
  EXPECT_EQ(user_error_of([&] { check_workers_count(three, 4, "--pp 4"); }),
            "w.json has 3 workers, but --pp 4 has 4 ranks");
  EXPECT_EQ(user_error_of([&] { check_workers_count(three, 3, "--pp 3"); }), "");
}

TEST(WorkersProfile, MemoryLimitsAndPlacementsFromTheCommandLine) {
  EXPECT_EQ(parse_worker_memory_limits("2e9", 3), (std::vector<double>{2e9, 2e9, 2e9}));
  EXPECT_EQ(parse_worker_memory_limits("0,1e6", 2), (std::vector<double>{0, 1e6}));
  EXPECT_NE(user_error_of([] {
              parse_worker_memory_limits("1,2,3", 2);
            }).find("has 3 limits, but the run has 2 ranks"),
            std::string::npos);
  for (const char* bad : {"-1", "1e9x", "", "1,,2", "nan"}) {
    EXPECT_NE(user_error_of([&] {
                parse_worker_memory_limits(bad, 3);
              }).find("is not a number of bytes >= 0"),
              std::string::npos)
        << bad;
  }
  EXPECT_EQ(parse_placement("2,0,1", 3, "--placement"), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(format_placement({2, 0, 1}), "2,0,1");
  EXPECT_TRUE(is_identity({0, 1, 2}));
  EXPECT_TRUE(is_identity({}));
  EXPECT_FALSE(is_identity({1, 0}));
  EXPECT_NE(user_error_of([] {
              parse_placement("0,0", 2, "--placement");
            }).find("--placement gives worker 0 two ranks"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              parse_placement("0,2", 2, "--placement");
            }).find("'2' is not a worker of 0..1"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              parse_placement("0", 2, "--placement");
            }).find("has 1 workers, but the run has 2 ranks"),
            std::string::npos);
}

TEST(DataParallelShares, ParsedCheckedAndWeighed) {
  EXPECT_EQ(parse_dp_shares("24,8", "--dp-shares"), (std::vector<int>{24, 8}));
  EXPECT_EQ(format_dp_shares({24, 8}), "24,8");
  for (const char* bad : {"", "24,", "0,32", "-8,40", "8.5", "x"}) {
    EXPECT_NE(user_error_of([&] { parse_dp_shares(bad, "--dp-shares"); }).find("--dp-shares: '"),
              std::string::npos)
        << bad;
  }
  EXPECT_EQ(user_error_of([] { check_dp_shares({24, 8}, 2, 4, "--dp-shares"); }), "");
  EXPECT_EQ(user_error_of([] {
              check_dp_shares({24, 8}, 3, 4, "--dp-shares");
            }),
            "--dp-shares has 2 shares, but the run has 3 copies of the pipeline (one share each)");
  EXPECT_NE(user_error_of([] {
              check_dp_shares({26, 6}, 2, 4, "--dp-shares");
            }).find("copy 0's share 26 is not a positive multiple of the 4 microbatches"),
            std::string::npos);
  EXPECT_TRUE(equal_shares({8, 8, 8}));
  EXPECT_TRUE(equal_shares({}));
  EXPECT_FALSE(equal_shares({24, 8}));
  EXPECT_EQ(share_weight({24, 8}, 0), 0.75);
  EXPECT_EQ(share_weight({24, 8}, 1), 0.25);
}

TEST(DataParallelShares, ASlowCopyTakesLess) {
  // pp 2 x dp 2, speeds 1, 1, 1, 0.33: copy 1's second rank is three times slower, so copy 1
  // runs at a third of copy 0's pace and takes a quarter of the batch.
  const std::vector<double> rates = copy_rates({2.0, 2.0}, {1, 1, 1, 0.33});
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_DOUBLE_EQ(rates[0], 0.5);
  EXPECT_DOUBLE_EQ(rates[1], 0.33 / 2);
  const std::vector<int> shares = choose_dp_shares(rates, 32, 4);
  EXPECT_EQ(shares, (std::vector<int>{24, 8}));
  EXPECT_LT(slowest_copy_time(shares, rates), slowest_copy_time({16, 16}, rates));
  // Equal workers keep equal shares; every copy keeps at least one sample per microbatch.
  EXPECT_EQ(choose_dp_shares({1, 1, 1}, 24, 4), (std::vector<int>{8, 8, 8}));
  EXPECT_EQ(choose_dp_shares({1, 0.01}, 16, 4), (std::vector<int>{12, 4}));
  // The shares are the best there are: no other split of 8 samples per microbatch is faster.
  const std::vector<double> three = {1, 0.5, 0.8};
  const std::vector<int> chosen = choose_dp_shares(three, 40, 2);
  for (int a = 1; a <= 18; ++a) {
    for (int b = 1; a + b <= 19; ++b) {
      const std::vector<int> other = {2 * a, 2 * b, 2 * (20 - a - b)};
      EXPECT_LE(slowest_copy_time(chosen, three), slowest_copy_time(other, three));
    }
  }
}

}  // namespace
}  // namespace pptrain
