// The synchronous family: generators whose schedules flush once per mini-batch and step every
// stage after it (generators/generators.h, auto_schedule.h, ilp_schedule.h), on the synchronous
// weight rule. Each equals one process (`--pp 1`).
#include "pptrain/generators/families/families.h"
#include "pptrain/generators/generators.h"

namespace pptrain {
namespace {

Schedule with_chunks(const ScheduleOptions& o) {
  return make_interleaved_1f1b(o.ranks, o.microbatches, o.chunks);
}

Schedule zb_auto(const ScheduleOptions& o) {
  const AutoScheduleOptions options{o.ranks, o.microbatches, o.costs, o.memory_limit,
                                    o.rank_memory_limits};
  if (o.solver == ScheduleSolver::kIlp) return make_zb_ilp(options, o.time_limit_s, o.ilp_report);
  return make_zb_auto(options);
}

}  // namespace

std::vector<ScheduleEntry> synchronous_family() {
  return {
      {"gpipe", 1, 1, 1,
       "GPipe: all forwards, then all backwards; bubble (P-1)/(M+P-1), M microbatches of "
       "activations",
       without_chunks<make_gpipe>},
      {"1f1b", 1, 1, 1,
       "PipeDream-Flush / DAPPLE: warm-up forwards, then one forward one backward; GPipe's "
       "bubble with at most P microbatches of activations",
       without_chunks<make_1f1b>},
      {"interleaved-1f1b", 2, 2, 0,
       "Megatron's virtual stages: stage s on rank s mod P, 1/V of 1F1B's bubble; M a multiple "
       "of P, or fewer than P (one group of M)",
       with_chunks},
      {"zb-h1", 1, 1, 1,
       "zero bubble H1: backward split into I and W, the W's fill 1F1B's bubble; 1F1B's memory",
       without_chunks<make_zb_h1>},
      {"zb-h2", 1, 1, 1,
       "zero bubble H2: more warm-up forwards, no bubble when F = I = W; about twice 1F1B's "
       "memory",
       without_chunks<make_zb_h2>},
      {"zb-v", 2, 2, 2,
       "zero bubble V: rank r holds stages r and 2P-1-r; no bubble from M >= 2P with 1F1B's "
       "memory",
       without_chunks<make_zb_v>},
      {"zb-auto", 1, 1, 1,
       "zero bubble, automatic: the paper's greedy places F, I, W for the cost model (--cost) "
       "under --memory-limit K (one microbatch's activations on a stage = 1; P: ZB-1p, 2P: "
       "ZB-2p)",
       zb_auto},
      {"v-half", 2, 2, 2,
       "V-Half (controllable memory): ZB-V's placement, one repeating block per microbatch; "
       "(P+2)/2 microbatches of activations, about half of 1F1B's; bubble about 7/12 of 1F1B's",
       without_chunks<make_v_half>},
      {"v-min", 2, 2, 2,
       "V-Min (controllable memory): the tightest V block; (P+4)/3 microbatches of activations, "
       "about a third of 1F1B's; bubble about 2/3 of 1F1B's",
       without_chunks<make_v_min>},
      {"dualpipev", 2, 2, 2,
       "DualPipeV: torch.distributed.pipelining's ScheduleDualPipeV order, forwards and "
       "backwards of the two stages paired in OVERLAP_F_B actions; M >= 2P",
       without_chunks<make_dualpipev>},
  };
}

}  // namespace pptrain
