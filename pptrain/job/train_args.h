// The options of a training run by name, and what the ones given mean: the one list that
// `pptrain train`'s flags (tools/pptrain/train_command.cpp) and the keywords of Python's
// `pptrain.train()` (python/src/runtime_module.cpp) are bound from, with their help, their
// defaults and the checks that need to know which were given.
//
//   TrainArgs args;                                   // every default
//   for (const TrainFlag& flag : train_flags()) ...   // bind flag.name to flag.target(args)
//   TrainOptions options = resolve_train_args(args, {"--model", "--steps", "--pp", ...});
//   RunResult result = run_training(options);         // job/supervisor.h
//
// A flag's name is its command-line spelling ("--batch-size"); its Python keyword is the name
// without the dashes, with '_' for '-' (batch_size).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "pptrain/runtime/cluster_env.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// TrainOptions as given, with the two flags that are read into it only once they are resolved,
// and torchrun's flags of the nodes (run_training()'s second argument).
struct TrainArgs {
  TrainOptions options;
  std::string seq_len_range;  // "MIN:MAX": each batch has its own sequence length (gpt)
  std::string plan_path;      // plan.json of `pptrain plan`
  NodeGroupOptions nodes;
};

// Where a flag's value goes: a field of TrainArgs, typed as the field is.
using TrainFlagTarget = std::variant<int*, uint64_t*, double*, std::string*, bool*>;

struct TrainFlag {
  const char* name;  // "--layers"
  const char* help;
  std::function<TrainFlagTarget(TrainArgs& args)> target;
  unsigned traits = 0;  // of the k* below

  static constexpr unsigned kSwitch = 1;       // no value: given, it sets its bool (--quiet)
  static constexpr unsigned kShowDefault = 2;  // --help prints its default
  static constexpr unsigned kRequired = 4;
  // What a launcher passes its workers, not a user's flag (--stage-layers): not in --help.
  static constexpr unsigned kHidden = 8;
  // torchrun's flags of the nodes (--nnodes, --node-rank, --rdzv-endpoint, ...): `pptrain run`
  // takes them too, and both also take torchrun's other spelling (--node_rank), unlisted.
  static constexpr unsigned kNode = 16;
  bool has(unsigned trait) const { return (traits & trait) != 0; }
};

// Every flag of `pptrain train`, in the order --help lists them; the options of the schedule
// families (generators/registry.h: FamilyOption) are among them, bound into
// TrainOptions::family (resolve_train_args() keeps the given ones only).
const std::vector<TrainFlag>& train_flags();

// What the flags in `given` (their names, "--pp") mean together: --plan's settings applied (a
// given flag contradicting it is an error), --seq-len-range resolved into the model's and the
// data's lengths, the data's seed set to the model's. UserError (one line naming the flag) for
// a required flag not given, or flags that contradict each other.
TrainOptions resolve_train_args(const TrainArgs& args, const std::set<std::string>& given);

}  // namespace pptrain
