// pptrain's own declarations of the few Gloo names that torch's ProcessGroupGloo.hpp mentions.
// The torch wheel ships that header but none of Gloo's; pptrain only constructs the group and
// calls its virtual functions, which live in the wheel's libtorch_cpu, so the types are never
// used here beyond pointers to them (see cmake/PptrainTorch.cmake). Not Gloo's interface: never
// include these from code of our own.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {

// The base of ProcessGroupGloo::GlooStore, which overrides these (pptrain never makes one).
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace gloo::rendezvous
