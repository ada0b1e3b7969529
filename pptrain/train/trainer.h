// Pipeline-parallel training from start to end: what `pptrain train` runs in every worker.
//
//   TrainOptions options;                            // gpt, 1f1b, ...
//   options.pp = 2; options.schedule = "1f1b";
//   Schedule lowered = plan_training(options);       // all user errors surface here
//   auto transport = connect_transport(TransportOptions::from_env());
//   train(options, lowered, *transport);             // rank 0 prints and writes the outputs
//
// plan_training() checks everything that can be checked before any worker starts: model and data
// options, the schedule (generated or read from CSV, then validated), the split of the model
// into stages. train() builds this rank's stages, runs the steps through one Executor, clips the
// global gradient norm and steps the optimizer after each flush, gathers losses, measured
// timelines and memory on rank 0, and saves the parameters one file per layer.
#pragma once

#include <string>

#include "pptrain/data/data.h"
#include "pptrain/models/model.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {

struct TrainOptions {
  ModelOptions model;
  DataOptions data;  // batch_size, microbatches (M), seed, source
  int pp = 1;        // P: worker processes
  int chunks = 0;    // V: stages per rank; 0 = the schedule's default
  // Which layers each stage holds: uniform | params | time | FILE.json (partition_plan.h).
  std::string partition = "uniform";
  std::string
      stage_layers;  // resolved ranges "0-2,3-5" (a launcher's workers); wins over partition
  std::string schedule = "1f1b";  // a generator name (schedule_names())
  std::string schedule_file;      // or a CSV schedule for P ranks (takes precedence)
  int steps = 10;
  std::string optimizer = "sgd";  // "sgd" (momentum 0.9) or "adamw" (weight decay 0.01)
  double lr = 0;                  // 0: 0.05 for sgd, 1e-3 for adamw
  double clip = 1.0;              // max global gradient norm; 0 = no clipping
  std::string metrics_path;       // JSON lines, one per step
  std::string trace_path;         // Chrome trace of the last step
  std::string svg_path;           // SVG timeline of the last step
  std::string save_dir;           // parameters after the last step, DIR/layer_<i>.pt
  std::string load_dir;           // parameters to start from, same layout
  int threads = 1;                // compute threads per process (workers: P processes, P cores)
  bool quiet = false;             // no per-step lines on stdout
  // Keep only each stage's input between F and its backward, and rerun F before I or B.
  bool recompute = false;
  // After the last step, simulate the schedule with this run's own measured costs and print
  // predicted against measured (sim/compare.h); with svg_path, draw both timelines.
  bool compare_sim = false;
};

// Checks the options and returns the lowered schedule to run. UserError (one line) for anything
// a user can get wrong. With pp == 1 every schedule name means the same single-stage run:
// all microbatches' forwards, then all their backwards.
ValidatedSchedule plan_training(const TrainOptions& options);

// Runs this process's rank of the training (transport.world_size() must be options.pp).
void train(const TrainOptions& options, const ValidatedSchedule& schedule, Transport& transport);

}  // namespace pptrain
