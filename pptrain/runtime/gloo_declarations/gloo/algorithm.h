// pptrain's own declarations of the few Gloo names that torch's ProcessGroupGloo.hpp mentions.
// The torch wheel ships that header but none of Gloo's; pptrain only constructs the group and
// calls its virtual functions, which live in the wheel's libtorch_cpu, so the types are never
// used here beyond pointers to them (see cmake/PptrainTorch.cmake). Not Gloo's interface: never
// include these from code of our own.
#pragma once
// Nothing of it is named outside the wheel.
