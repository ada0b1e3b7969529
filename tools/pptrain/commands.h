// The CLI's subcommands. Each lives in its own file (`<name>_command.cpp`) and registers itself
// on the app; its callback does the work and throws pptrain::UserError on bad input.
#pragma once

#include <CLI/CLI.hpp>

namespace pptrain::cli {

void add_schedule_command(CLI::App& app);
void add_partition_command(CLI::App& app);
#ifdef PPTRAIN_WITH_RUNTIME
void add_train_command(CLI::App& app);
void add_profile_command(CLI::App& app);
#endif

}  // namespace pptrain::cli
