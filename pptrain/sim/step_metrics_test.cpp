#include "pptrain/sim/step_metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"

namespace pptrain {
namespace {

StepMetrics two_ranks() {
  StepMetrics m;
  m.step = 3;
  m.loss = 2.5;
  m.step_time_s = 0.125;
  m.samples_per_s = 256;
  m.tokens_per_s = 16384;
  m.bubble_ratio = 0.25;
  m.grad_norm = 1.5;
  m.peak_activation_bytes = {1000, 500};
  m.weight_versions = {2, 1};
  m.optimizer_state_bytes = {64, 64};
  m.compute_s = std::vector<double>{0.5, 0.25};
  m.bytes_sent = std::vector<int64_t>{4096, 4096};
  m.weight_bytes = std::vector<int64_t>{32, 32};
  m.rollbacks = 1;
  m.checkpoint_stall_s = 0.75;
  m.resident_bytes = {1 << 20, 1 << 21};
  m.peak_memory_bytes = {2000, 1000};
  m.predicted_peak_memory_bytes = {1900, 1100};
  return m;
}

TEST(StepMetrics, LineHasTheRuntimesKeysInOrder) {
  // What `pptrain train --metrics` has written line by line since compute_s, bytes_sent and
  // weight_bytes were added; tests and Python read these keys.
  EXPECT_EQ(to_json(two_ranks()).dump(),
            "{\"step\":3,\"loss\":2.5,\"step_time_s\":0.125,\"samples_per_s\":256.0,"
            "\"tokens_per_s\":16384.0,\"bubble_ratio\":0.25,\"grad_norm\":1.5,"
            "\"peak_activation_bytes\":[1000,500],\"weight_versions\":[2,1],"
            "\"optimizer_state_bytes\":[64,64],\"compute_s\":[0.5,0.25],"
            "\"bytes_sent\":[4096,4096],\"weight_bytes\":[32,32],\"rollbacks\":1,"
            "\"checkpoint_stall_s\":0.75,\"resident_bytes\":[1048576,2097152],"
            "\"peak_memory_bytes\":[2000,1000],\"predicted_peak_memory_bytes\":[1900,1100]}");
}

TEST(StepMetrics, ReadsBackWhatItWrites) {
  const StepMetrics m = two_ranks();
  const StepMetrics again = step_metrics_from_json(to_json(m).dump());
  EXPECT_EQ(to_json(again).dump(), to_json(m).dump());
}

TEST(StepMetrics, FieldsOfAnOlderRuntimeAreAbsentNotZero) {
  const StepMetrics m = step_metrics_from_json(
      R"({"loss":9,"bubble_ratio":0.1,"peak_activation_bytes":[20,10],"optimizer_state_bytes":[5,5]})");
  EXPECT_EQ(m.loss, 9);
  EXPECT_EQ(m.peak_activation_bytes, (std::vector<int64_t>{20, 10}));
  EXPECT_FALSE(m.compute_s);
  EXPECT_FALSE(m.bytes_sent);
  EXPECT_FALSE(m.weight_bytes);
  EXPECT_EQ(m.step, 0);
}

TEST(StepMetrics, FileErrorsNameTheFileAndLine) {
  const std::string path =
      ::testing::TempDir() + "pptrain_step_metrics_" + std::to_string(::getpid()) + ".jsonl";
  write_text_file(path, to_json(two_ranks()).dump() + "\n\n{\"loss\":1}\n", "test file");
  try {
    read_metrics_file(path);
    FAIL() << "a line without bubble_ratio was read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics file '" + path + "' line 3: "), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("bubble_ratio"), std::string::npos) << e.what();
  }
  write_text_file(path, "\n", "test file");
  EXPECT_THROW(read_metrics_file(path), UserError);
  write_text_file(path, to_json(two_ranks()).dump() + "\n" + to_json(two_ranks()).dump() + "\n",
                  "test file");
  EXPECT_EQ(read_metrics_file(path).size(), 2u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pptrain
