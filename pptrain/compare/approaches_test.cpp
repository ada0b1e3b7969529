#include "pptrain/compare/approaches.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "pptrain/common/check.h"
#include "pptrain/common/testing.h"
#include "pptrain/generators/registry.h"

namespace pptrain {
namespace {

using testing::user_error_of;

TEST(Approaches, TheSurveysFourteenRowsAreEachARegistrySchedule) {
  const std::vector<Approach>& table = survey_approaches();
  ASSERT_EQ(table.size(), 14u);
  EXPECT_EQ(table.front().name, "GPipe");
  EXPECT_EQ(table[2].name, "DAPPLE");
  EXPECT_EQ(table[2].schedule, "1f1b");
  EXPECT_EQ(table.back().name, "WPipe");
  const std::vector<std::string> names = schedule_names();
  for (const Approach& a : table) {
    EXPECT_NE(std::find(names.begin(), names.end(), a.schedule), names.end()) << a.schedule;
  }
  const auto avgpipe = std::find_if(table.begin(), table.end(),
                                    [](const Approach& a) { return a.name == "AvgPipe"; });
  ASSERT_NE(avgpipe, table.end());
  EXPECT_EQ(avgpipe->dp, 2);
  EXPECT_FALSE(avgpipe->survey_sync);
  EXPECT_TRUE(avgpipe->survey_extra_memory);
  EXPECT_FALSE(avgpipe->survey_extra_compute);
  EXPECT_TRUE(avgpipe->survey_extra_comm);
  EXPECT_EQ(avgpipe->survey_convergence, "Good");
}

TEST(Approaches, ParseNamesTheLineOfABadRow) {
  const std::string header =
      "# a comment\n"
      "approach,schedule,dp,survey_schedule,convergence,extra_memory,extra_compute,"
      "extra_communication\n";
  const std::vector<Approach> one = parse_approaches(header + "A,1f1b,1,Sync,Good,,X,\r\n", "t");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].survey_extra_compute);
  EXPECT_FALSE(one[0].survey_extra_comm);
  EXPECT_NE(user_error_of([&] {
              parse_approaches(header + "A,1f1b,1,Sync,Good,,\n", "t");
            }).find("t line 3: expected 8 cells"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              parse_approaches(header + "A,1f1b,1,Maybe,Good,,,\n", "t");
            }).find("survey_schedule must be Sync or Async, got 'Maybe'"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              parse_approaches(header + "A,1f1b,1,Sync,Good,Y,,\n", "t");
            }).find("an extra_* cell is X or empty, got 'Y'"),
            std::string::npos);
  EXPECT_NE(
      user_error_of([&] { parse_approaches("a,b\n", "t"); }).find("t line 1: expected the header"),
      std::string::npos);
  EXPECT_NE(user_error_of([&] { parse_approaches(header, "t"); }).find("t: no approach"),
            std::string::npos);
}

TEST(Approaches, OnlyTakesNamesInAnyCaseOrSchedulesInTableOrder) {
  const std::vector<Approach>& table = survey_approaches();
  EXPECT_EQ(select_approaches(table, std::nullopt).size(), table.size());
  const std::vector<Approach> some = select_approaches(table, "pipedream,dapple,GPIPE");
  ASSERT_EQ(some.size(), 3u);
  EXPECT_EQ(some[0].name, "GPipe");
  EXPECT_EQ(some[1].name, "DAPPLE");
  EXPECT_EQ(some[2].name, "PipeDream");
  EXPECT_NE(user_error_of([&] {
              select_approaches(table, "1f1b,nosuch");
            }).find("--only: unknown approach 'nosuch' (expected a comma list of GPipe (gpipe)"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { select_approaches(table, ""); }).find("--only: no approach named"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { select_approaches(table, "1f1b,"); }).find("--only: empty name"),
            std::string::npos);
}

}  // namespace
}  // namespace pptrain
