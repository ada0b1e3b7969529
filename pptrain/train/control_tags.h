// Tags of the train loop's own messages between ranks (step reports, the settings check). They
// sit above every pipeline message's tag (kControlTagBase, runtime/transport.h), so the two
// kinds never meet; listing them in one place keeps them apart from each other.
#pragma once

#include "pptrain/runtime/transport.h"

namespace pptrain {

enum class ControlTag : int {
  kReportHeader = 1,  // report.cpp: a rank's step measurements, then its events
  kReportEvents,
  kSettingsLength,  // agreement.cpp: a rank's settings text, then rank 0's verdict
  kSettings,
  kVerdictLength,
  kVerdict,
  kPartialNorm,  // train/updates.cpp, --post-validation: the partial sum of squared gradient norms
  kFullNorm,     // ... and the full one, from the last rank back to the others
  // train/tied_parameters.cpp, asynchronous schedules: a tied parameter's gradients, two tags
  // per tie from this one up (to its first copy, from it); keep it last.
  kTiedGradients,
};

inline int tag_of(ControlTag tag) {
  return kControlTagBase + static_cast<int>(tag);
}

}  // namespace pptrain
