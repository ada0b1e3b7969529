// The precision a run computes in (`--precision fp32|bf16|fp16`), as plain data: its name, and
// the bytes of one element of the activations and messages it makes. Parameters, gradients and
// optimizer state stay fp32 at every precision (master weights); device/precision.h holds what
// a precision means to LibTorch.
//
//   Precision p = parse_precision("bf16", "--precision");   // UserError for "fp8"
//   activation_element_bytes(p)                              // 2
#pragma once

#include <string>

#include "pptrain/common/check.h"

namespace pptrain {

enum class Precision { kFp32, kBf16, kFp16 };

inline const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "fp32";
}

// UserError starting with `flag` for a name that is none of fp32, bf16, fp16.
inline Precision parse_precision(const std::string& name, const std::string& flag) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    if (name == precision_name(p)) return p;
  }
  throw UserError(flag + " " + name + ": expected fp32, bf16 or fp16");
}

// Bytes of one floating-point element of the activations, and so of the messages between stages.
inline int activation_element_bytes(Precision precision) {
  return precision == Precision::kFp32 ? 4 : 2;
}

// fp16's narrow range needs the loss scaled (and the steps whose gradients overflow skipped).
inline bool scales_loss(Precision precision) {
  return precision == Precision::kFp16;
}

}  // namespace pptrain
