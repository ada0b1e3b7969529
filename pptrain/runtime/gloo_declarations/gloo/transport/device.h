// pptrain's own declarations of the few Gloo names that torch's ProcessGroupGloo.hpp mentions.
// The torch wheel ships that header but none of Gloo's; pptrain only constructs the group and
// calls its virtual functions, which live in the wheel's libtorch_cpu, so the types are never
// used here beyond pointers to them (see cmake/PptrainTorch.cmake). Not Gloo's interface: never
// include these from code of our own.
#pragma once

namespace gloo::transport {

class Device;         // held by shared_ptr only
class UnboundBuffer;  // held by unique_ptr inside the wheel's work objects

}  // namespace gloo::transport
