// Every generator's schedules survive CSV: parse_csv(to_csv(s)) == s, and export -> import ->
// export gives the same bytes, compute-only and lowered (with SEND/RECV). Each generated
// schedule is also validated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/generators/generators.h"
#include "pptrain/generators/registry.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/semantics.h"
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

  // Named after the test and the process: CTest runs the tests of this file side by side.
  const std::string stem = ::testing::TempDir() + "pptrain_roundtrip_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                           std::to_string(::getpid());
  const std::string first = stem + "_first.csv";
  const std::string second = stem + "_second.csv";
  write_schedule_csv(s, first);
  write_schedule_csv(read_schedule_csv(first), second);
  EXPECT_EQ(read_file(first), read_file(second)) << what;
  EXPECT_EQ(read_file(first), to_csv(s)) << what;
  std::remove(first.c_str());
  std::remove(second.c_str());
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

// A replicated schedule's placement is not written: import reads it back from where each
// (stage, microbatch) runs, so export -> import gives the same schedule, placement included.
TEST(CsvRoundTrip, ReplicatedPlacementIsInferredFromTheRows) {
  for (const Schedule& s :
       {make_chimera(4, 8), make_gems(6, 4), make_1f1b_rr({3, 1}, 7), make_1f1b_rr({1, 2, 1}, 5)}) {
    SCOPED_TRACE(s.name);
    expect_round_trips(s, s.name + " (compute only)");
    expect_round_trips(lower(s), s.name + " (with comms)");
    const Schedule reduced = add_grad_reductions(s);
    expect_round_trips(reduced, s.name + " (reduced)");
    EXPECT_NO_THROW(validate(parse_csv(to_csv(reduced), s.name)));
  }
  // One stage on two rows: microbatch 0 on rank 0, microbatch 1 on rank 1.
  const Schedule two = parse_csv("0F0,0B0\n0F1,0B1\n");
  EXPECT_TRUE(two.replicated());
  EXPECT_EQ(two.placement, (std::vector<std::vector<int>>{{0, 1}}));
  EXPECT_EQ(two.stage_to_rank, (std::vector<int>{0}));
  EXPECT_NO_THROW(validate(two));
  // Still errors: one (stage, microbatch) on two ranks, a reduction on a rank without the stage.
  try {
    parse_csv("0F0,0F1,0B1\n0B0\n");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2: stage 0 also appears on rank 0 for microbatch 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_csv("0F0,0B0\n1F0,1B0,0REDUCE_GRAD\n"), UserError);
  // A replicated file whose microbatch index is a typo is a message, not a huge table.
  EXPECT_THROW(parse_csv("0F0,0B0\n0F999999999,0B999999999\n"), UserError);
}

}  // namespace
}  // namespace pptrain
