// Observers of a training run: everything rank 0 does with a step's report besides training.
//
// The train loop (job/trainer.h) knows nothing of stdout, files or pictures: it hands each
// StepReport (report.h) to a list of observers, in order. The CLI makes the list from its flags
// with make_observers(); a program of its own can pass any observers, or none.
//
//   LogPrinter          the run's header, then one line per step on stdout (not with --quiet)
//   SimComparison       --compare-sim: on the last step, simulates the schedule with the run's own
//                       measured costs and prints predicted against measured
//   MetricsWriter       --metrics FILE: one JSON line per step (with the comparison, if any)
//   TraceWriter         --trace FILE: the last step's measured Chrome trace
//   SvgWriter           --svg FILE: the last step's measured timeline (above the prediction,
//                       with --compare-sim)
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/sim/compare.h"
#include "pptrain/sim/step_metrics.h"
#include "pptrain/train/plan.h"
#include "pptrain/train/report.h"

namespace pptrain {

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_start(const RunInfo& /*run*/) {}  // before the first step
  virtual void on_step(const StepReport& report) = 0;
  virtual void on_end(const RunInfo& /*run*/) {}  // after the last step and the save
};

class LogPrinter : public StepObserver {
 public:
  void on_start(const RunInfo& run) override;
  void on_step(const StepReport& report) override;
  void on_end(const RunInfo& run) override;
};

// The measured steps of a start that a comparison with the simulation reads: every step but
// the start's first (a warm-up: first touches, cold caches), at most the latest `kept`.
// SimComparison compares them at the run's last step, a Python schedule's compare_sim() when
// the program asks.
class MeasuredSteps {
 public:
  explicit MeasuredSteps(size_t kept = SIZE_MAX) : kept_(kept) {}
  void start(const RunInfo& run);  // a new start (a run moved to a new cut) is compared alone
  void add(const StepReport& report);
  // The schedule simulated with the kept steps' costs against their makespan, or with the
  // warm-up's when it is the only step and `or_warmup`; none without a step.
  std::optional<Comparison> compare(bool or_warmup) const;
  void clear() { steps_.clear(); }  // the next comparison reads the steps after this

 private:
  size_t kept_;
  std::optional<ValidatedSchedule> schedule_;
  int seen_ = 0;  // steps of this start
  std::optional<Timeline> warmup_;
  std::vector<Timeline> steps_;
};

class SimComparison : public StepObserver {
 public:
  void on_start(const RunInfo& run) override { steps_.start(run); }
  void on_step(const StepReport& report) override;
  // The comparison, once the last step has been seen.
  const std::optional<Comparison>& result() const { return result_; }

 private:
  MeasuredSteps steps_;
  std::optional<Comparison> result_;
};

// One step's figures as a line of --metrics holds them (sim/step_metrics.h).
StepMetrics step_metrics(const StepReport& report);

class MetricsWriter : public StepObserver {
 public:
  // `comparison`, when given, must come before this writer in the observer list.
  MetricsWriter(std::string path, const SimComparison* comparison = nullptr);
  void on_start(const RunInfo& run) override;
  void on_step(const StepReport& report) override;

 private:
  std::string path_;
  const SimComparison* comparison_;
  std::ofstream out_;
  // On every line: "links" ({"0-1": "shm"}), "restart" and "layout" ({"pp", "dp", "stages",
  // "stage_layers"}) of the run's current start.
  nlohmann::ordered_json run_fields_;
};

class TraceWriter : public StepObserver {
 public:
  explicit TraceWriter(std::string path) : path_(std::move(path)) {}
  void on_step(const StepReport& report) override;
  void on_end(const RunInfo& run) override;

 private:
  std::string path_;
  std::optional<Timeline> latest_;  // the run's latest step, written at its end
};

class SvgWriter : public StepObserver {
 public:
  // `comparison`, when given, must come before this writer in the observer list.
  SvgWriter(std::string path, const SimComparison* comparison = nullptr);
  void on_start(const RunInfo& run) override;
  void on_step(const StepReport& report) override;
  void on_end(const RunInfo& run) override;

 private:
  std::string path_;
  const SimComparison* comparison_;
  std::string run_;                   // "1f1b, P=2, M=8", for the title
  std::optional<StepReport> latest_;  // the run's latest step, drawn at its end
};

// The observers `pptrain train` runs for its flags, in the order they must run.
std::vector<std::unique_ptr<StepObserver>> make_observers(const TrainOptions& options);

}  // namespace pptrain
