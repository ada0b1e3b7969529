#include "pptrain/compare/comparison.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/compare/report.h"
#include "pptrain/partition/testing.h"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

class CompareRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("pptrain_compare_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // What it writes and refuses: tests/stand_in_trainer.sh.
    trainer_ = testing::repo_root() + "/tests/stand_in_trainer.sh";
  }
  void TearDown() override { fs::remove_all(dir_); }

  CompareOptions options() const {
    CompareOptions o;
    o.out = (dir_ / "out").string();
    o.pptrain = trainer_;
    o.steps = 4;
    o.only = "1f1b,PipeDream,gpipe,wpipe";
    return o;
  }

  fs::path dir_;
  std::string trainer_;
};

const ApproachRow& row_of(const CompareResult& result, const std::string& schedule) {
  for (const ApproachRow& row : result.rows) {
    if (row.approach.schedule == schedule) return row;
  }
  throw InternalError("no row for " + schedule);
}

TEST_F(CompareRun, MeasuresEachRowAgainstTheReferenceAndDapple) {
  std::vector<std::string> lines;
  const CompareResult result =
      run_compare(options(), [&](const std::string& line) { lines.push_back(line); });
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].rfind("compare: [1/5] reference (--pp 1 --schedule 1f1b): ", 0), 0u);
  EXPECT_EQ(lines[4], "compare: [5/5] WPipe (wpipe): not built in " + trainer_);
  EXPECT_EQ(result.options.loss_at, 2);

  const ApproachRow& dapple = row_of(result, "1f1b");
  EXPECT_EQ(status_text(dapple), "sync");
  EXPECT_NEAR(*dapple.simulated_bubble, 0.273, 5e-4);
  EXPECT_DOUBLE_EQ(*dapple.measured_bubble, 0.2);
  EXPECT_DOUBLE_EQ(*dapple.memory_ratio, 1);

  const ApproachRow& pipedream = row_of(result, "pipedream");
  EXPECT_EQ(status_text(pipedream), "async");
  EXPECT_FALSE(pipedream.memory_ratio);  // no weight_bytes
  EXPECT_FALSE(pipedream.comm_ratio);    // no bytes_sent
  EXPECT_DOUBLE_EQ(*pipedream.activation_ratio, 2);
  EXPECT_DOUBLE_EQ(*pipedream.compute_ratio, 1.5);
  EXPECT_DOUBLE_EQ(*pipedream.final_loss_ratio, 6.5 / 6);

  EXPECT_EQ(status_text(row_of(result, "gpipe")), "failed: pptrain: error: gpipe broke");
  const ApproachRow& wpipe = row_of(result, "wpipe");
  EXPECT_EQ(status_text(wpipe), "not built");
  EXPECT_EQ(wpipe.run.wall_s, 0);
  EXPECT_TRUE(wpipe.simulated_bubble);  // this program's registry has it

  ASSERT_EQ(result.disagreements.size(), 1u);
  EXPECT_EQ(result.disagreements[0].text,
            "PipeDream: survey has no extra compute, measured 1.50x DAPPLE's");
}

TEST_F(CompareRun, WritesTheTableTheJsonAndTheChart) {
  const CompareResult result = run_compare(options());
  const std::vector<std::string> paths = write_compare_files(result);
  ASSERT_EQ(paths.size(), 3u);
  const std::string md = read_text_file(paths[0], "compare.md");
  EXPECT_NE(md.find("```\npptrain compare --out " + options().out +
                    " --only 1f1b,PipeDream,gpipe,wpipe --pptrain " + trainer_ + " --steps 4\n```"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("\n| DAPPLE | `1f1b` | sync [Sync] | 0.273 / 0.200 | 1.000 | 1.000 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("\n| WPipe | `wpipe` | not built [Async] |"), std::string::npos) << md;
  EXPECT_NE(md.find("\n- PipeDream: survey has no extra compute, measured 1.50x"),
            std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(read_text_file(paths[1], "compare.json"));
  EXPECT_EQ(json["approaches"].size(), 4u);
  EXPECT_TRUE(json["approaches"][2]["measured"]["memory_ratio"].is_null());  // PipeDream's
  EXPECT_EQ(json["config"]["loss_at"], 2);
  const std::string svg = read_text_file(paths[2], "losses.svg");
  // DAPPLE, PipeDream and the reference: three lines.
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++lines;
  EXPECT_EQ(lines, 3u);
  for (const char* run : {"reference-pp1", "1f1b", "pipedream"}) {
    EXPECT_TRUE(
        fs::is_regular_file(fs::path(options().out) / "runs" / (std::string(run) + ".jsonl")));
  }
}

TEST_F(CompareRun, BadOptionsStopBeforeAnyRun) {
  const auto error_of = [](CompareOptions o) {
    try {
      check_compare_options(o);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CompareOptions o = options();
  o.steps = 0;
  EXPECT_NE(error_of(o).find("--steps must be >= 1"), std::string::npos);
  o = options();
  o.loss_at = 5;
  EXPECT_NE(error_of(o).find("--loss-at must be 1 .. --steps (4), got 5"), std::string::npos);
  o = options();
  o.batch_size = 20;
  EXPECT_NE(error_of(o).find("--batch-size must be a positive multiple"), std::string::npos);
  o = options();
  o.pptrain = "/nonexistent";
  EXPECT_NE(error_of(o).find("--pptrain: '/nonexistent' is not an executable"), std::string::npos);
  o = options();
  o.pptrain.clear();
  EXPECT_NE(error_of(o).find("--pptrain PATH is required"), std::string::npos);
  o = options();
  o.only = "";
  EXPECT_NE(error_of(o).find("--only: no approach named"), std::string::npos);
  EXPECT_FALSE(fs::exists(fs::path(options().out) / "runs" / "reference-pp1.out"));
}

TEST(CompareCommandLine, NamesTheFlagsThatDifferFromTheirDefaults) {
  CompareOptions o;
  o.out = "cmp dir";
  EXPECT_EQ(compare_command_line(o),
            (std::vector<std::string>{"pptrain", "compare", "--out", "cmp dir"}));
  o.only = "1f1b";
  o.model = "mlp";
  o.steps = 3;
  EXPECT_EQ(compare_command_line(o),
            (std::vector<std::string>{"pptrain", "compare", "--out", "cmp dir", "--only", "1f1b",
                                      "--model", "mlp", "--steps", "3"}));
}

}  // namespace
}  // namespace pptrain
