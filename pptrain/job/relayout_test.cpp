#include "pptrain/job/relayout.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/job/testing.h"

namespace pptrain {
namespace {

TrainOptions small_run() {
  return testing::small_gpt(/*blocks=*/4, /*seq_len=*/8, /*pp=*/3);
}

// Two ranks: --pp 2 --dp 1 and --pp 1 --dp 2 both apply; each is planned and predicted, the
// faster taken, the other named beside it; the layers are timed once, for the next call too.
TEST(Relayout, PredictsEveryLayoutOfTheRanksAndTakesTheFastest) {
  std::optional<Profile> layers;
  TrainOptions options = small_run();
  // (A restart continues from the newest checkpoint of --save: none yet here.)
  options.save_dir = ::testing::TempDir() + "relayout-" + std::to_string(::getpid());
  const Relayout next = relayout(options, 2, /*restarted=*/true, layers);
  EXPECT_EQ(next.options.pp * next.options.dp, 2);
  ASSERT_TRUE(next.plan.has_value());
  EXPECT_EQ(next.plan->copies, next.options.dp);
  EXPECT_EQ(next.options.resume_dir, "auto");
  const std::string other = next.options.dp == 1 ? "--pp 1 --dp 2: " : "--pp 2 --dp 1: ";
  EXPECT_EQ(next.choice.rfind("predicted ", 0), 0u) << next.choice;
  EXPECT_NE(next.choice.find(other), std::string::npos) << next.choice;
  ASSERT_TRUE(layers.has_value());
  EXPECT_EQ(layers->layers.size(), 6u);  // embedding, 4 blocks, head
}

// Three ranks: a batch of 8 does not split over 3 copies, so --pp 3 is the one layout, taken
// without timing anything.
TEST(Relayout, OneLayoutThatAppliesIsTakenWithoutTiming) {
  std::optional<Profile> layers;
  const Relayout next = relayout(small_run(), 3, /*restarted=*/false, layers);
  EXPECT_EQ(next.options.pp, 3);
  EXPECT_EQ(next.options.dp, 1);
  EXPECT_TRUE(next.choice.empty());
  EXPECT_FALSE(layers.has_value());
  EXPECT_TRUE(next.options.resume_dir.empty());
}

// No layout of 7 ranks fits a model of 6 layers and a batch of 8: one line naming the last
// reason.
TEST(Relayout, NoLayoutThatFitsIsAUserError) {
  std::optional<Profile> layers;
  try {
    relayout(small_run(), 7, false, layers);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("no layout of 7 ranks fits the run (--pp", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pptrain
