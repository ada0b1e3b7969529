// `pptrain compare`: the survey's table of pipeline approaches, measured (docs/APPROACHES.md).
// Its flags bound to the library's run (compare/comparison.h) and writers (compare/report.h):
//
//   pptrain compare --out cmp                               # 14 approaches, 300 steps each
//   pptrain compare --out cmp --only 1f1b,pipedream --steps 3 --pptrain build/tools/pptrain/pptrain
//
// Prints a line per run as it ends, then the three files it wrote.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "pptrain/compare/comparison.h"
#include "pptrain/compare/report.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {
namespace {

// PPTRAIN_RUNTIME_BINARY is empty when this build has no pptrain-runtime (main.cpp).
constexpr bool kHasRuntime = sizeof(PPTRAIN_RUNTIME_BINARY) > 1;

// This process's command line, as typed (/proc/self/cmdline): what compare.md shows.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  std::string word;
  while (std::getline(in, word, '\0')) words.push_back(word);
  return words;
}

void run_compare_command(CompareOptions options) {
  options.this_program_trains = kHasRuntime;
  options.command = own_command_line();
  const CompareResult result = run_compare(options, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  const std::vector<std::string> paths = write_compare_files(result);
  std::printf("compare: wrote %s, %s, %s\n", paths[0].c_str(), paths[1].c_str(), paths[2].c_str());
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto options = std::make_shared<CompareOptions>();
  auto only = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Train one configuration with each approach of the survey and write its table, measured");
  CompareOptions& o = *options;
  cmd->add_option("--out", o.out,
                  "Folder for compare.md, compare.json, losses.svg and runs/<schedule>.jsonl")
      ->required();
  CLI::Option* only_option =
      cmd->add_option("--only", *only,
                      "Comma list of approaches to run (survey names or schedules, e.g. "
                      "1f1b,pipedream); default: all 14");
  cmd->add_option("--pptrain", o.pptrain,
                  "The pptrain binary that trains (with its pptrain-runtime); default: this one");
  cmd->add_option("--model", o.model, "Model: gpt or mlp")->capture_default_str();
  cmd->add_option("--layers", o.layers, "Blocks (Megatron-LM needs a multiple of 2 x --pp)")
      ->capture_default_str();
  cmd->add_option("--d-model", o.d_model, "Model width")->capture_default_str();
  cmd->add_option("--heads", o.heads, "Attention heads (gpt)")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "Tokens per sample (gpt)")->capture_default_str();
  cmd->add_option("--data", o.data, "As pptrain train --data")->capture_default_str();
  cmd->add_option("--pp", o.pp, "Pipeline ranks of every approach")->capture_default_str();
  cmd->add_option("--batch-size", o.batch_size, "Samples per step (AvgPipe: over its 2 copies)")
      ->capture_default_str();
  cmd->add_option("--microbatches", o.microbatches, "Microbatches per step (M)")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Optimizer steps of every run")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the weights and the data")->capture_default_str();
  cmd->add_option("--loss-at", o.loss_at,
                  "Step of the second convergence column; default: --steps / 2");
  cmd->callback([options, only, only_option] {
    if (only_option->count() > 0) options->only = *only;
    run_compare_command(*options);
  });
}

}  // namespace pptrain::cli
