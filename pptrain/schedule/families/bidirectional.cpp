// The bidirectional family: two pipelines in opposite directions over the same ranks, so every
// stage has two replicas whose gradients are reduced after the flush (schedule/reductions.h);
// synchronous.
#include "pptrain/schedule/families/families.h"
#include "pptrain/schedule/generators.h"

namespace pptrain {

std::vector<ScheduleEntry> bidirectional_family() {
  return {
      {"chimera", 1, 1, 1,
       "Chimera: two pipelines in opposite directions, stage s on ranks s and P-1-s, half the "
       "microbatches each way; bubble (P-2) max(F, B) per P microbatches; P even, M a "
       "multiple of P",
       without_chunks<make_chimera>},
      {"gems", 1, 1, 1,
       "GEMS: Chimera's two replicas, one microbatch in flight per direction; 2 microbatches of "
       "activations, bubble ratio (P-2)/P; P and M even",
       without_chunks<make_gems>},
  };
}

}  // namespace pptrain
