// Test helpers for the partition room: where the shipped PipeDream profiles live.
//
//   Profile vgg = read_profile(shipped_graph("vgg16"));
//
// The profiles are in the repository (data/pipedream/<model>/graph.txt), found from this file's
// own path, so the tests run from any build directory of a clean clone.
#pragma once

#include <string>

namespace pptrain::testing {

inline std::string repo_root() {
  std::string here = __FILE__;  // <root>/pptrain/partition/testing.h
  for (int up = 0; up < 3; ++up) here = here.substr(0, here.find_last_of('/'));
  return here;
}

inline std::string shipped_graph(const std::string& model) {
  return repo_root() + "/data/pipedream/" + model + "/graph.txt";
}

}  // namespace pptrain::testing
