// `pptrain compare`: the survey's table of pipeline approaches (approaches.h), measured. Trains
// one configuration with each approach (one `pptrain train` child process after the other, the
// machine being small) plus one --pp 1 reference run, reads their metrics files
// (sim/step_metrics.h) and makes the survey's columns as measured figures beside the survey's
// marks. The CLI and Python (`pptrain.plan.compare()`) both call run_compare(); report.h
// writes what it returns.
//
//   CompareOptions options;
//   options.out = "cmp";
//   options.only = "1f1b,pipedream";
//   options.pptrain = "/usr/bin/pptrain";
//   CompareResult result = run_compare(options, [](const std::string& line) { puts(...); });
//   write_compare_files(result);   // cmp/compare.md, compare.json, losses.svg
//
// Each run's metrics are OUT/runs/<schedule>.jsonl, its stdout and stderr beside them (.out,
// .err). A run that fails is a row marked "failed: <first line of its stderr>"; an approach the
// training binary refuses as an unknown schedule (one of another build) is "not built".
//
// What each column measures (ratios are to DAPPLE's run, i.e. 1f1b on the same pipeline):
//   schedule     "sync" when every step's loss equals the --pp 1 run's to 1e-5 relative
//   bubble       the simulator's (unit costs F = I = W = 1; an asynchronous schedule over
//                kCompareSimulatedSteps steps without a flush) and the median over the steps
//                after the first of the metrics' bubble_ratio
//   convergence  final loss and the loss at --loss-at, each / the --pp 1 run's
//   memory       max over steps and ranks of weight_bytes + optimizer_state_bytes; peak
//                activation bytes (max over ranks and steps) in a column of its own
//   compute      mean over the steps after the first of the sum over ranks of compute_s
//   comm         mean over the steps after the first of the sum over ranks of bytes_sent
// A metrics field the runtime does not write (compute_s, bytes_sent, weight_bytes are recent)
// gives no figure ("n/a").
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/compare/approaches.h"

namespace pptrain {

// Steps of M microbatches an asynchronous schedule is simulated over (`pptrain schedule`'s
// default --steps): its steady state crosses step boundaries.
constexpr int kCompareSimulatedSteps = 3;
// Two losses are "equal" (a synchronous schedule) within this relative difference.
constexpr double kCompareSyncTolerance = 1e-5;
// A measured ratio above this is "extra" where the survey has no mark.
constexpr double kCompareExtraThreshold = 1.05;
// The schedule of the approach every ratio but the losses' is to (DAPPLE), and of the --pp 1
// reference run.
constexpr const char* kCompareBaselineSchedule = "1f1b";

// The flags of `pptrain compare`, with their defaults; messages name the flags.
struct CompareOptions {
  std::string model = "gpt";  // gpt or mlp
  int layers = 8;
  int d_model = 64;
  int heads = 4;
  int seq_len = 64;
  std::string data = "default";  // as `pptrain train --data`
  int pp = 4;
  int batch_size = 32;  // samples per step over all microbatches (and over --dp copies)
  int microbatches = 8;
  int steps = 300;
  int seed = 1;
  int loss_at = 0;                  // step of the second convergence column; 0: steps / 2
  std::string out;                  // required: the folder of the files and of runs/
  std::optional<std::string> only;  // comma list of approaches or schedules; nullopt: all
  // The binary that trains (`pptrain train`, with its pptrain-runtime beside it). Empty: this
  // program (/proc/self/exe) when `this_program_trains`, else a UserError naming --pptrain.
  std::string pptrain;
  bool this_program_trains = false;  // the CLI built with its runtime
  // The command line compare.md and compare.json show; empty: compare_command_line().
  std::vector<std::string> command;
};

// What a run's metrics file says, per step. Optional fields stay empty when absent.
struct RunMetrics {
  std::vector<double> loss;          // [steps]
  std::vector<double> bubble_ratio;  // [steps]
  std::vector<double> compute_s;     // [steps] sum over ranks; empty: field absent
  std::vector<double> bytes_sent;    // [steps] sum over ranks; empty: field absent
  // Max over steps and ranks of weight_bytes + optimizer_state_bytes; empty: field absent.
  std::optional<double> weights_optimizer_bytes;
  std::optional<double> peak_activation_bytes;  // max over steps and ranks
};

struct RunOutcome {
  enum class Status { kOk, kFailed, kNotBuilt, kNotRun };
  Status status = Status::kNotRun;
  std::string failure;  // kFailed: the first line of its stderr (or why it failed)
  double wall_s = 0;    // 0 unless it trained (kOk, kFailed)
  RunMetrics metrics;   // kOk
};

// One approach's row: the run and what was made of it.
struct ApproachRow {
  Approach approach;
  RunOutcome run;
  std::optional<double> simulated_bubble;
  std::string simulation_error;  // why simulated_bubble is absent
  std::optional<bool> sync;      // measured; absent without both runs
  std::optional<double> measured_bubble, final_loss, loss_at;
  std::optional<double> final_loss_ratio, loss_at_ratio;
  std::optional<double> memory_ratio, activation_ratio, compute_ratio, comm_ratio;
};

// Where a measured column and the survey's mark disagree.
struct Disagreement {
  std::string approach, column, text;
};

struct CompareResult {
  CompareOptions options;  // as run: loss_at and pptrain filled in
  RunOutcome reference;    // the --pp 1 run
  std::vector<ApproachRow> rows;
  std::vector<Disagreement> disagreements;
};

// Checks every option before any run starts (UserError naming the flag), fills in the defaults
// that depend on others (loss_at, pptrain) and makes OUT/runs.
void check_compare_options(CompareOptions& options);

// `pptrain compare` with the flags that differ from their defaults: the command line that runs
// these options.
std::vector<std::string> compare_command_line(const CompareOptions& options);

// Checks the options, trains the reference and every selected approach in turn, and makes the
// table. `progress`, when given, gets one line per run as it ends ("compare: [2/3] ...").
CompareResult run_compare(CompareOptions options,
                          const std::function<void(const std::string& line)>& progress = {});

// "sync", "async", "n/a", "failed: <why>", "not built" or "not run": a row's status cell.
std::string status_text(const ApproachRow& row);

}  // namespace pptrain
