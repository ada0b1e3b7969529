// The CLI's subcommands. Each lives in its own file (`<name>_command.cpp`) and registers itself
// on the app; its callback does the work and throws pptrain::UserError on bad input.
//
// Two programs share them: `pptrain` (main.cpp: schedule, partition, plan, compare; no LibTorch)
// and `pptrain-runtime` (runtime_main.cpp: train, profile, run), which `pptrain` runs for those.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/generators/registry.h"
#include "pptrain/job/run_result.h"

namespace pptrain {
struct TrainArgs;
struct TrainFlag;
}  // namespace pptrain

namespace pptrain::cli {

void add_schedule_command(CLI::App& app);
void add_partition_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_compare_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_run_command(CLI::App& app);

// Flag values of the planner commands (flag_values.cpp). The whole of `text` as an integer >= 1,
// or nothing (empty, not a number, other characters after it, below 1).
std::optional<int> positive_int(const std::string& text);
// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {}.
std::vector<std::string> split_commas(const std::string& text);
// The required `--profile FILE` of partition and plan.
CLI::Option* add_profile_option(CLI::App* command, std::string& path);
// The schedule families' options (generators/registry.h: family_options(), the list `pptrain
// train`'s flags come from too) as flags of `command`: each one given goes into `values` under
// its flag, checked later against the schedule (check_family_options).
void add_family_flags(CLI::App* command, FamilyValues& values);

// Binds a flag of `pptrain train`'s list (job/train_args.h) to its place in `args`; a flag of
// the nodes (TrainFlag::kNode) also under torchrun's other spelling, unlisted (--node_rank).
// In train_command.cpp: `pptrain-runtime` only (`train`, `run`).
CLI::Option* add_train_flag(CLI::App* command, const TrainFlag& flag, TrainArgs& args);

// A run that failed (train, run): its line as "pptrain: error: <message>" and its exit status,
// now. Returns when the run succeeded.
void exit_unless_ok(const RunResult& result);

// Parses the command line and runs the chosen subcommand; turns every error into one line on
// stderr and the exit status: 0 (also for --help), 2 for a user's mistake, 1 otherwise.
int run_cli(CLI::App& app, int argc, char** argv);

}  // namespace pptrain::cli
