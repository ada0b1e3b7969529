#include "pptrain/job/train_args.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/generators/registry.h"
#include "pptrain/train/plan_training.h"

namespace pptrain {
namespace {

constexpr unsigned kSwitch = TrainFlag::kSwitch;
constexpr unsigned kShowDefault = TrainFlag::kShowDefault;
constexpr unsigned kRequired = TrainFlag::kRequired;
constexpr unsigned kHidden = TrainFlag::kHidden;
constexpr unsigned kNode = TrainFlag::kNode;

// "MIN:MAX" with 1 <= MIN <= MAX.
std::pair<int64_t, int64_t> parse_seq_len_range(const std::string& text) {
  const size_t colon = text.find(':');
  const auto number = [](const std::string& part) -> int64_t {
    if (part.empty() || part.size() > 9 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return -1;
    return std::stoll(part);
  };
  const int64_t min = colon == std::string::npos ? -1 : number(text.substr(0, colon));
  const int64_t max = colon == std::string::npos ? -1 : number(text.substr(colon + 1));
  PPTRAIN_CHECK(min >= 1 && max >= min, "--seq-len-range '", text,
                "' is not MIN:MAX with whole numbers 1 <= MIN <= MAX");
  return {min, max};
}

// The family options of the registry as flags, each once, in the registry's order; a flag's
// value goes into TrainOptions::family under its name.
std::vector<TrainFlag> family_flags() {
  std::vector<TrainFlag> flags;
  for (const FamilyOption* option : family_options()) {
    const bool is_switch = option->kind == FamilyOption::Kind::kSwitch;
    const FamilyValue initial = is_switch                                  ? FamilyValue(false)
                                : option->kind == FamilyOption::Kind::kInt ? FamilyValue(0)
                                                                           : FamilyValue(0.0);
    const std::string name = option->flag;
    flags.push_back({option->flag.c_str(), option->help.c_str(),
                     [name, initial](TrainArgs& a) -> TrainFlagTarget {
                       const auto [slot, _] = a.options.family.emplace(name, initial);
                       return std::visit([](auto& v) -> TrainFlagTarget { return &v; },
                                         slot->second);
                     },
                     is_switch ? kSwitch : 0u});
  }
  return flags;
}

}  // namespace

const std::vector<TrainFlag>& train_flags() {
  static const std::vector<TrainFlag> before_family = {
      {"--model", "Model: gpt, mlp or unet",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.kind; }, kRequired},
      {"--layers", "Transformer / MLP blocks",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.layers; }, kShowDefault},
      {"--d-model", "Model width",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.d_model; }, kShowDefault},
      {"--heads", "Attention heads (gpt)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.heads; }, kShowDefault},
      {"--seq-len", "Tokens per sample (gpt)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.seq_len; }, kShowDefault},
      {"--tie-embeddings",
       "gpt: the head's output weight is the embedding's token table (each stage keeps "
       "a copy; their gradients are summed before every step)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.tie_embeddings; }, kSwitch},
      {"--seq-len-range",
       "MIN:MAX: each batch has its own sequence length, drawn from MIN..MAX by the "
       "seed and the step (gpt; the position table has MAX rows)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.seq_len_range; }},
      {"--data",
       "Training text file, 'synthetic', or 'default' (a text under "
       "/usr/share/common-licenses)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.data.source; }, kShowDefault},
      {"--pp", "Pipeline ranks (worker processes per copy of the pipeline)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.pp; }},
      {"--dp",
       "Copies of the pipeline (data parallelism): D x P workers, each copy trains on "
       "1/D of --batch-size and the copies of a stage average their gradients",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.dp; }},
      {"--dp-shares",
       "N0,N1,...: the samples of --batch-size each --dp copy trains on per step (positive "
       "multiples of --microbatches summing to --batch-size), their gradients weighed by "
       "them, so a copy on slower ranks can take fewer; default: 1/D each",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.dp_shares; }},
      {"--zero",
       "1: shard the optimizer state over the --dp copies (each keeps and steps about "
       "1/D of the layers' state, then shares the new weights); 0: no sharding",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.zero; }},
      {"--chunks", "Stages per rank (interleaved-1f1b, zb-v); 0 = the schedule's default",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.chunks; }, kShowDefault},
      {"--schedule", "Schedule (see the list below)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.schedule; }, kShowDefault},
      {"--schedule-file", "Schedule CSV (one row per rank)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.schedule_file; }},
      {"--cost",
       "Cost model zb-auto plans for: F, I, W times of one rank's share for one "
       "microbatch and the comm latency (as `pptrain schedule --cost`); default: the "
       "per-stage times of --partition when it is a profile, else F=1,I=1,W=1,comm=0",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.cost; }},
      {"--memory-limit",
       "Cap on every rank's peak activations, in units of one microbatch's forward "
       "activations on a stage (P: 1F1B's memory); zb-auto plans under it, other "
       "schedules are refused above it; 0: none",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.memory_limit; }, kShowDefault},
      {"--solver",
       "How zb-auto orders the actions: heuristic or ilp (CBC, warm-started from the "
       "heuristic, never worse; solved once by the launcher)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.solver; }, kShowDefault},
      {"--time-limit", "--solver ilp: seconds CBC may search (wall time)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.time_limit_s; }, kShowDefault},
      {"--solved-schedule", "The order the launcher solved (CSV; --solver ilp)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.solved_schedule; }},
      {"--mem-w-ratio", "Share r of a microbatch's activations that W still needs after I",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.mem_w_ratio; }, kShowDefault},
      {"--partition",
       "Layers per stage: uniform, params (balanced parameter bytes), time (profiles "
       "this machine first; under torchrun give a profile instead), workers (time for the "
       "ranks' own measured speeds: a slower rank gets fewer layers), or FILE.json (from "
       "`pptrain partition --json`, or a profile from `pptrain profile`, cut with "
       "time)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.partition; }, kShowDefault},
      {"--save-workers",
       "With --partition workers: write the ranks' measured speeds and memory limits to FILE "
       "(pptrain-workers-1 JSON), for pptrain plan --workers-profile",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.save_workers; }},
      {"--worker-memory-limits",
       "With --partition workers or --replan auto: each rank's memory limit in bytes instead "
       "of its cgroup's, one for all or one per rank (B0,B1,...; 0: the cgroup's); the cut "
       "keeps every rank's predicted peak within its own",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.worker_memory_limits; }},
      {"--placement",
       "Which worker (launch rank) runs each rank of the run, W0,W1,... (a permutation; "
       "default: rank r on worker r); --partition workers chooses one when not given",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.placement; }},
      {"--replan",
       "auto: the ranks watch each other's compute time per step and, when one stays slower "
       "(or faster) than the cut expects, move layers (and ranks between workers) at the next "
       "step boundary, as --partition workers would cut for the speeds now; off: never",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.replan; }, kShowDefault},
      {"--stage-layers", "Resolved stage layer ranges, e.g. 0-2,3-5",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.stage_layers; }, kHidden},
      {"--microbatches", "Microbatches per step (M)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.data.microbatches; }},
      {"--batch-size", "Samples per step, over all microbatches",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.data.batch_size; }},
      {"--plan",
       "plan.json of `pptrain plan`: sets --pp, --microbatches, --batch-size, the "
       "schedule, the stage layers and --recompute (a flag contradicting it is an "
       "error)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.plan_path; }},
      {"--steps", "Optimizer steps",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.steps; }, kRequired},
      {"--lr", "Learning rate; 0 = 0.05 for sgd, 1e-3 for adamw",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.lr; }, kShowDefault},
      {"--optimizer", "sgd (with --momentum) or adamw (weight decay 0.01)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.optimizer; }, kShowDefault},
      {"--momentum", "sgd's momentum",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.momentum; }, kShowDefault},
      {"--warmup-steps",
       "Grow the learning rate linearly from lr/N to lr over the first N steps "
       "(asynchronous schedules: by the step a microbatch belongs to); 0 = none",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.warmup_steps; }, kShowDefault},
      {"--clip", "Max global gradient norm; 0 = off (asynchronous schedules: each stage's own)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.clip; }, kShowDefault},
      {"--stages",
       "With --pp 1: run the model as this many stages in one process, the reference "
       "an asynchronous schedule on that many ranks must match",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.stages; }, kShowDefault},
  };
  static const std::vector<TrainFlag> after_family = {
      {"--seed", "Seed of the weights and the data",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.model.seed; }, kShowDefault},
      {"--threads", "Compute threads per process",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.threads; }, kShowDefault},
      {"--comm-timeout",
       "Seconds a rank waits for a peer's message or a collective before it stops, "
       "naming the peer and the operation (default: PPTRAIN_COMM_TIMEOUT_S, else 60)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.comm_timeout_s; }},
      {"--stopped-timeout",
       "Seconds a worker may stay stopped (SIGSTOP) before the launcher stops the run, "
       "naming it",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.stopped_timeout_s; }, kShowDefault},
      {"--nnodes",
       "Nodes of the run, N or MIN:MAX (c10d rendezvous); this process starts the ranks of "
       "its own node, as torchrun's node agent",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.nnodes; }, kNode | kShowDefault},
      {"--nproc-per-node",
       "Ranks on this node (train: default --pp x --dp over --nnodes; run: default 1)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.nproc_per_node; }, kNode},
      {"--node-rank", "This node's place, 0..nnodes-1 (static rendezvous)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.node_rank; }, kNode | kShowDefault},
      {"--master-addr",
       "Host of rank 0, where the ranks meet (static rendezvous; under mpirun on several "
       "hosts, instead of MASTER_ADDR); default 127.0.0.1",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.master_addr; }, kNode},
      {"--master-port",
       "Port of rank 0's store (default: a free port on one node, 29500 on several)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.master_port; }, kNode},
      {"--rdzv-backend",
       "static (--node-rank, --master-addr) or c10d (the node agents meet at "
       "--rdzv-endpoint and are given their node ranks there)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.rdzv_backend; }, kNode},
      {"--rdzv-endpoint", "c10d: HOST[:PORT] of the node agents' store (default port 29400)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.rdzv_endpoint; }, kNode},
      {"--rdzv-id", "c10d: the run's id, the same on every node (TORCHELASTIC_RUN_ID)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.rdzv_id; }, kNode | kShowDefault},
      {"--rdzv-conf",
       "c10d: join_timeout=S (default 600: how long an agent waits for the others), "
       "last_call_timeout=S (default 30: with MIN:MAX, how long past MIN nodes)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.nodes.rdzv_conf; }, kNode},
      {"--metrics", "Write one JSON line of metrics per step",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.metrics_path; }},
      {"--trace", "Write the last step's measured Chrome trace (JSON)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.trace_path; }},
      {"--svg", "Write the last step's measured timeline (SVG)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.svg_path; }},
      {"--save",
       "Write a checkpoint folder after the last step: parameters, optimizer state, "
       "step (replaced whole, never half-written)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.save_dir; }},
      {"--save-every", "Also write the checkpoint after every N steps (synchronous schedules)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.save_every; }},
      {"--keep", "Checkpoints to keep: --save DIR and the K-1 before it as DIR.step-<step>",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.keep; }, kShowDefault},
      {"--sync-save",
       "Write checkpoints in the step loop; by default a save copies each rank's state "
       "to memory and a thread writes it while training goes on",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.sync_save; }, kSwitch},
      {"--load", "Start from the parameters of a checkpoint (step 0, a fresh optimizer)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.load_dir; }},
      {"--resume",
       "Continue the run that saved a checkpoint: its parameters, optimizer state and "
       "step, up to --steps (counted from the run's start); any --pp. 'auto': the "
       "newest whole checkpoint in --save DIR (or DIR.step-<k>), or a fresh start",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.resume_dir; }},
      {"--max-restarts",
       "When a worker dies, hangs or the run fails (not on bad input, exit 2), stop "
       "every rank and start again from the newest whole checkpoint of --save DIR, at "
       "most N times",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.max_restarts; }, kShowDefault},
      {"--quiet", "No per-step lines",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.quiet; }, kSwitch},
      {"--recompute",
       "Keep only each stage's input between forward and backward; rerun the forward "
       "before the backward (less activation memory, one more forward)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.recompute; }, kSwitch},
      {"--weight-split",
       "How zero-bubble schedules split a backward into I and W: deferred (the layers' "
       "own deferred weight gradients) or autograd (any module's way: input gradient "
       "first, then the weights' from the kept graph)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.weight_split; }, kShowDefault},
      {"--post-validation",
       "No all-reduce before the optimizer step: ranks step on the partial gradient "
       "norm passed along the pipeline and take the step back when the full norm says "
       "clip or skip (the zero-bubble paper's post-validation; same results)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.post_validation; }, kSwitch},
      {"--exact-rollback",
       "With --post-validation: undo a step from saved copies (bit for bit) instead of "
       "inverting the optimizer's update",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.exact_rollback; }, kSwitch},
      {"--precision",
       "What the stages compute in: fp32, bf16 or fp16 (forwards under autocast, the "
       "activations and messages in it; parameters, gradients and optimizer state stay "
       "float32; fp16 scales the loss and skips a step whose gradients overflow, on every "
       "rank)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.precision; }, kShowDefault},
      {"--weight-casts",
       "With bf16 or fp16: microbatch (each use casts the float32 weight) or step (each "
       "weight cast once per step and kept until its end: less work, the copies' memory; "
       "synchronous schedules)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.weight_casts; }, kShowDefault},
      {"--device",
       "Where each rank computes: cpu, cuda (rank LOCAL_RANK of a host on its GPU, ranks "
       "beyond the GPUs sharing them; messages cross through host memory) or auto (cuda "
       "when a GPU is visible, else cpu)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.device; }, kShowDefault},
      {"--skip-nonfinite",
       "Skip the optimizer step of a step whose loss or gradients are not finite "
       "(default: stop the run, exit status 1, naming the step)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.skip_nonfinite; }, kSwitch},
      {"--compare-sim",
       "After training, simulate the schedule with this run's measured per-stage times "
       "and print predicted vs measured (with --svg: both timelines)",
       [](TrainArgs& a) -> TrainFlagTarget { return &a.options.compare_sim; }, kSwitch},
  };
  static const std::vector<TrainFlag> flags = [] {
    std::vector<TrainFlag> all = before_family;
    for (const TrainFlag& flag : family_flags()) all.push_back(flag);
    for (const TrainFlag& flag : after_family) all.push_back(flag);
    return all;
  }();
  return flags;
}

TrainOptions resolve_train_args(const TrainArgs& args, const std::set<std::string>& given) {
  const auto has = [&given](const char* flag) { return given.count(flag) > 0; };
  for (const TrainFlag& flag : train_flags()) {
    PPTRAIN_CHECK(!flag.has(kRequired) || has(flag.name), flag.name, " is required");
  }
  TrainOptions o = args.options;
  for (auto it = o.family.begin(); it != o.family.end();) {
    it = has(it->first.c_str()) ? std::next(it) : o.family.erase(it);
  }
  PPTRAIN_CHECK(!has("--time-limit") || o.solver == "ilp",
                "--time-limit applies to --solver ilp only (the heuristic takes milliseconds)");
  if (!args.plan_path.empty()) {
    PlanFlagsGiven plan_given;
    plan_given.pp = has("--pp");
    plan_given.microbatches = has("--microbatches");
    plan_given.batch_size = has("--batch-size");
    plan_given.schedule = has("--schedule");
    plan_given.schedule_file = has("--schedule-file");
    plan_given.chunks = has("--chunks");
    plan_given.partition = has("--partition");
    plan_given.stage_layers = has("--stage-layers");
    plan_given.dp = has("--dp");
    plan_given.precision = has("--precision");
    apply_plan_file(read_plan_file(args.plan_path), plan_given, o);
  } else {
    for (const char* flag : {"--pp", "--microbatches", "--batch-size"}) {
      PPTRAIN_CHECK(has(flag), flag, " is required (or --plan FILE)");
    }
  }
  if (!args.seq_len_range.empty()) {
    const auto [min, max] = parse_seq_len_range(args.seq_len_range);
    PPTRAIN_CHECK(!has("--seq-len") || o.model.seq_len == max, "--seq-len ", o.model.seq_len,
                  " and --seq-len-range ", args.seq_len_range, " disagree: give one of them");
    o.model.seq_len = max;
    o.data.min_seq_len = min;
  }
  o.data.seed = o.model.seed;
  return o;
}

}  // namespace pptrain
