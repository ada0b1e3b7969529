// What a profile given as --partition FILE tells zb-auto: each stage's layers' times summed; the
// other partition methods carry no times.
#include "pptrain/train/partition_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace pptrain {
namespace {

TEST(ProfiledStageTimes, SumEachStagesLayers) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pptrain_profiled_stage_times_" + std::to_string(::getpid()) + ".json");
  nlohmann::json layers = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) {
    layers.push_back({{"name", "layer" + std::to_string(i)},
                      {"forward_ms", 1.0 + i},
                      {"backward_input_ms", 2.0},
                      {"backward_weight_ms", 0.5 * i},
                      {"activation_bytes", 1},
                      {"stash_bytes", 1},
                      {"parameter_bytes", 1}});
  }
  std::ofstream(path) << nlohmann::json{{"format", "pptrain-profile-1"}, {"layers", layers}};
  const auto times = profiled_stage_times(path.string(), {{0, 0}, {1, 3}});
  std::filesystem::remove(path);
  ASSERT_TRUE(times.has_value());
  EXPECT_EQ(times->forward, (std::vector<double>{1, 2 + 3 + 4}));
  EXPECT_EQ(times->backward_input, (std::vector<double>{2, 6}));
  EXPECT_EQ(times->backward_weight, (std::vector<double>{0, 0.5 + 1 + 1.5}));
  for (const char* other : {"uniform", "params", "time"}) {
    EXPECT_FALSE(profiled_stage_times(other, {{0, 0}, {1, 3}}).has_value()) << other;
  }
}

}  // namespace
}  // namespace pptrain
