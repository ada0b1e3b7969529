// Test helpers for the partition room: where the shipped PipeDream profiles live.
//
//   Profile vgg = read_profile(shipped_graph("vgg16"));
//
// The profiles are in the repository (data/pipedream/<model>/graph.txt), found from
// PPTRAIN_SOURCE_DIR, which CMake gives the test binary, so the tests run from any build
// directory of a clean clone. (Not from __FILE__: under ccache with a base_dir it is relative.)
#pragma once

#include <string>

namespace pptrain::testing {

inline std::string repo_root() {
  return PPTRAIN_SOURCE_DIR;
}

inline std::string shipped_graph(const std::string& model) {
  return repo_root() + "/data/pipedream/" + model + "/graph.txt";
}

}  // namespace pptrain::testing
