// Every generator's schedules survive CSV: parse_csv(to_csv(s)) == s, and export -> import ->
// export gives the same bytes, compute-only and lowered (with SEND/RECV). Each generated
// schedule is also validated.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Checks both round trips for one schedule; `what` names it in failures.
void expect_round_trips(const Schedule& s, const std::string& what) {
  Schedule parsed = parse_csv(to_csv(s), s.name);
  parsed.flushes = s.flushes;  // the CSV holds actions and placement, not the flush mode
  EXPECT_EQ(parsed, s) << what << "\n" << to_csv(s);
  EXPECT_EQ(to_csv(parsed), to_csv(s)) << what;

  const std::string first = ::testing::TempDir() + "pptrain_roundtrip_first.csv";
  const std::string second = ::testing::TempDir() + "pptrain_roundtrip_second.csv";
  write_schedule_csv(s, first);
  write_schedule_csv(read_schedule_csv(first), second);
  EXPECT_EQ(read_file(first), read_file(second)) << what;
  EXPECT_EQ(read_file(first), to_csv(s)) << what;
}

TEST(CsvRoundTrip, EveryGeneratorAtSeveralShapes) {
  ASSERT_FALSE(schedule_names().empty());
  const int shapes[][3] = {
      // P, M, V (0: the schedule's default)
      {1, 1, 0}, {2, 2, 0}, {2, 5, 0}, {4, 4, 0}, {4, 8, 0}, {4, 12, 3}, {3, 7, 0}, {8, 16, 0}};
  for (const auto& name : schedule_names()) {
    int built = 0;
    for (const auto& shape : shapes) {
      ScheduleOptions options;
      options.name = name;
      options.ranks = shape[0];
      options.microbatches = shape[1];
      options.chunks = shape[2];
      const std::string what = name + " P=" + std::to_string(shape[0]) +
                               " M=" + std::to_string(shape[1]) + " V=" + std::to_string(shape[2]);
      Schedule s;
      try {
        s = make_schedule(options);
      } catch (const UserError&) {
        continue;  // a shape this schedule does not support (e.g. M not a multiple of P)
      }
      ++built;
      ASSERT_FALSE(s.has_comms()) << what;
      EXPECT_NO_THROW(validate(s)) << what;
      expect_round_trips(s, what + " (compute only)");
      const Schedule lowered = lower(s);
      EXPECT_NO_THROW(validate(lowered)) << what;
      expect_round_trips(lowered, what + " (with comms)");
      EXPECT_EQ(strip_comms(lowered), s) << what;
    }
    EXPECT_GE(built, 3) << name << " supports too few of the tested shapes";
  }
}

}  // namespace
}  // namespace pptrain
