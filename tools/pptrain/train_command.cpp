// `pptrain train`: pipeline-parallel training of a gpt, mlp or unet model following a schedule.
//
//   pptrain train --model gpt --layers 8 --pp 2 --schedule 1f1b --microbatches 8
//                 --batch-size 8 --steps 10 --metrics m.jsonl --trace last_step.json --save ckpt
//
// The flags are job/train_args.h's list, bound here; the run is job/supervisor.h's
// run_training(): not started as a rank and with --pp > 1 it checks the arguments, then starts
// P workers (itself forked, one per rank; with --nnodes, this node's share) and supervises them;
// started as a rank (by torchrun, `pptrain run`, srun or mpirun) it runs as that rank. --pp 1
// trains in this process: the reference every pipelined run must match.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include "pptrain/generators/registry.h"
#include "pptrain/job/supervisor.h"
#include "pptrain/job/train_args.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

CLI::Option* add_train_flag(CLI::App* cmd, const TrainFlag& flag, TrainArgs& args) {
  const auto add = [&](const std::string& name) {
    return std::visit(
        [&](auto* target) -> CLI::Option* {
          if constexpr (std::is_same_v<decltype(target), bool*>) {
            if (flag.has(TrainFlag::kSwitch)) return cmd->add_flag(name, *target, flag.help);
          }
          return cmd->add_option(name, *target, flag.help);
        },
        flag.target(args));
  };
  CLI::Option* option = add(flag.name);
  if (flag.has(TrainFlag::kRequired)) option->required();
  if (flag.has(TrainFlag::kShowDefault)) option->capture_default_str();
  if (flag.has(TrainFlag::kHidden)) option->group("");
  std::string torchrun_spelling = flag.name;
  std::replace(torchrun_spelling.begin() + 2, torchrun_spelling.end(), '-', '_');
  if (flag.has(TrainFlag::kNode) && torchrun_spelling != flag.name) {
    add(torchrun_spelling)->group("");
  }
  return option;
}

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd =
      app.add_subcommand("train", "Train a model split into a pipeline across worker processes");
  for (const TrainFlag& flag : train_flags()) add_train_flag(cmd, flag, *args);
  cmd->get_option("--schedule")->excludes(cmd->get_option("--schedule-file"));
  cmd->footer("Schedules (P ranks, M microbatches, V chunks per rank):\n" + schedule_help_text());
  cmd->callback([cmd, args] {
    std::set<std::string> given;
    for (const TrainFlag& flag : train_flags()) {
      if (cmd->get_option(flag.name)->count() > 0) given.insert(flag.name);
    }
    exit_unless_ok(run_training(resolve_train_args(*args, given), args->nodes));
  });
}

}  // namespace pptrain::cli
