#include "pptrain/job/train_args.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/common/keywords.h"

namespace pptrain {
namespace {

// A message's UserError from resolving `args` with `given`, or "" when it resolves.
std::string error_of(const TrainArgs& args, const std::set<std::string>& given) {
  try {
    resolve_train_args(args, given);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const std::set<std::string> kMinimal = {"--model", "--steps", "--pp", "--microbatches",
                                        "--batch-size"};

TEST(TrainFlags, EachNameIsOneFlagWithAPythonKeyword) {
  std::set<std::string> names, keywords;
  for (const TrainFlag& flag : train_flags()) {
    EXPECT_EQ(std::string(flag.name).rfind("--", 0), 0u) << flag.name;
    EXPECT_TRUE(names.insert(flag.name).second) << flag.name;
    EXPECT_TRUE(keywords.insert(keyword_of(flag.name)).second) << flag.name;
    // A switch sets a bool; every flag writes into the arguments it is given.
    TrainArgs args;
    const TrainFlagTarget target = flag.target(args);
    if (flag.has(TrainFlag::kSwitch)) {
      EXPECT_TRUE(std::holds_alternative<bool*>(target)) << flag.name;
    }
  }
  EXPECT_EQ(keyword_of("--batch-size"), "batch_size");
  EXPECT_EQ(keyword_of("--d-model"), "d_model");
  EXPECT_TRUE(keywords.count("max_restarts"));
}

TEST(TrainFlags, TargetsAreTheFieldsTheyName) {
  TrainArgs args;
  for (const TrainFlag& flag : train_flags()) {
    const std::string name = flag.name;
    if (name == "--layers") *std::get<int*>(flag.target(args)) = 7;
    if (name == "--batch-size") *std::get<int*>(flag.target(args)) = 12;
    if (name == "--seed") *std::get<uint64_t*>(flag.target(args)) = 5;
    if (name == "--save") *std::get<std::string*>(flag.target(args)) = "ckpt";
    if (name == "--max-restarts") *std::get<int*>(flag.target(args)) = 3;
  }
  EXPECT_EQ(args.options.model.layers, 7);
  EXPECT_EQ(args.options.data.batch_size, 12);
  EXPECT_EQ(args.options.model.seed, 5u);
  EXPECT_EQ(args.options.save_dir, "ckpt");
  EXPECT_EQ(args.options.max_restarts, 3);
}

TEST(ResolveTrainArgs, SetsTheDataSeedAndTheSequenceLengths) {
  TrainArgs args;
  args.options.model.seed = 9;
  args.seq_len_range = "4:24";
  const TrainOptions o = resolve_train_args(args, kMinimal);
  EXPECT_EQ(o.data.seed, 9u);
  EXPECT_EQ(o.model.seq_len, 24);
  EXPECT_EQ(o.data.min_seq_len, 4);
}

TEST(ResolveTrainArgs, NamesTheFlagThatIsMissingOrContradicts) {
  TrainArgs args;
  EXPECT_EQ(error_of(args, kMinimal), "");
  std::set<std::string> given = kMinimal;
  given.erase("--pp");
  EXPECT_EQ(error_of(args, given), "--pp is required (or --plan FILE)");
  given = kMinimal;
  given.erase("--model");
  EXPECT_EQ(error_of(args, given), "--model is required");
  given = kMinimal;
  given.insert("--time-limit");
  EXPECT_NE(error_of(args, given).find("--time-limit applies to --solver ilp only"),
            std::string::npos);
  args.seq_len_range = "9:3";
  EXPECT_NE(error_of(args, kMinimal).find("--seq-len-range '9:3' is not MIN:MAX"),
            std::string::npos);
  args.seq_len_range = "4:24";
  args.options.model.seq_len = 16;
  given = kMinimal;
  given.insert("--seq-len");
  EXPECT_EQ(error_of(args, given),
            "--seq-len 16 and --seq-len-range 4:24 disagree: give one of them");
}

}  // namespace
}  // namespace pptrain
