#include "pptrain/compare/comparison.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <type_traits>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/common/stats.h"
#include "pptrain/compare/child_process.h"
#include "pptrain/generators/registry.h"
#include "pptrain/planner/schedule_request.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"
#include "pptrain/sim/step_metrics.h"

namespace pptrain {
namespace {

// The reference run's file name under OUT/runs.
constexpr const char* kReferenceName = "reference-pp1";

std::string first_line(const std::string& text) {
  const size_t begin = text.find_first_not_of("\n\r ");
  if (begin == std::string::npos) return "";
  const size_t end = text.find('\n', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The median of the values, or nothing for none.
std::optional<double> median_of(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  return median(values);
}

// Their mean: a cost per step, which counts what happens every few steps only (avgpipe's
// averaging) at its share.
std::optional<double> mean(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// The values of every step after the first (the first step carries the start-up), or all of
// them for a one-step run.
std::vector<double> after_first(const std::vector<double>& values) {
  if (values.size() <= 1) return values;
  return {values.begin() + 1, values.end()};
}

std::optional<double> ratio(std::optional<double> value, std::optional<double> base) {
  if (!value || !base || *base == 0) return std::nullopt;
  return *value / *base;
}

template <typename T>
double sum_of(const std::vector<T>& values) {
  double sum = 0;
  for (T v : values) sum += static_cast<double>(v);
  return sum;
}

// A run's steps as the table reads them: per-step sums over ranks, maxima over the run.
RunMetrics run_metrics(const std::vector<StepMetrics>& steps) {
  RunMetrics m;
  bool has_compute = true, has_sent = true, has_weights = true;
  for (const StepMetrics& s : steps) {
    m.loss.push_back(s.loss);
    m.bubble_ratio.push_back(s.bubble_ratio);
    has_compute = has_compute && s.compute_s;
    if (s.compute_s) m.compute_s.push_back(sum_of(*s.compute_s));
    has_sent = has_sent && s.bytes_sent;
    if (s.bytes_sent) m.bytes_sent.push_back(sum_of(*s.bytes_sent));
    for (int64_t bytes : s.peak_activation_bytes) {
      m.peak_activation_bytes =
          std::max(m.peak_activation_bytes.value_or(0), static_cast<double>(bytes));
    }
    const std::vector<int64_t>& optimizer = s.optimizer_state_bytes;
    if (s.weight_bytes && s.weight_bytes->size() == optimizer.size()) {
      for (size_t r = 0; r < optimizer.size(); ++r) {
        const double bytes =
            static_cast<double>((*s.weight_bytes)[r]) + static_cast<double>(optimizer[r]);
        m.weights_optimizer_bytes = std::max(m.weights_optimizer_bytes.value_or(0), bytes);
      }
    } else {
      has_weights = false;
    }
  }
  if (!has_compute) m.compute_s.clear();
  if (!has_sent) m.bytes_sent.clear();
  if (!has_weights) m.weights_optimizer_bytes.reset();
  return m;
}

std::vector<std::string> train_command(const CompareOptions& o, int pp, const std::string& schedule,
                                       int dp, const std::string& metrics_path) {
  std::vector<std::string> argv = {o.pptrain,        "train",
                                   "--model",        o.model,
                                   "--layers",       std::to_string(o.layers),
                                   "--d-model",      std::to_string(o.d_model),
                                   "--heads",        std::to_string(o.heads),
                                   "--seq-len",      std::to_string(o.seq_len),
                                   "--data",         o.data,
                                   "--batch-size",   std::to_string(o.batch_size),
                                   "--microbatches", std::to_string(o.microbatches),
                                   "--steps",        std::to_string(o.steps),
                                   "--seed",         std::to_string(o.seed),
                                   "--pp",           std::to_string(pp),
                                   "--schedule",     schedule};
  if (dp > 1) argv.insert(argv.end(), {"--dp", std::to_string(dp)});
  argv.insert(argv.end(), {"--metrics", metrics_path, "--quiet"});
  return argv;
}

// Trains one configuration into OUT/runs/<name>.jsonl (.out, .err beside it). A run that stops
// with the registry's "unknown schedule" error for `schedule` is one the binary was not built
// with.
RunOutcome train_run(const CompareOptions& o, const std::string& name, int pp,
                     const std::string& schedule, int dp) {
  const std::string base = (std::filesystem::path(o.out) / "runs" / name).string();
  const std::string metrics_path = base + ".jsonl";
  std::filesystem::remove(metrics_path);
  const ChildResult child =
      run_child(train_command(o, pp, schedule, dp, metrics_path), base + ".out", base + ".err");
  RunOutcome outcome;
  if (child.exit_code != 0) {
    const std::string line = first_line(read_text_file(base + ".err", "run's stderr file"));
    if (line.find(unknown_schedule_text(schedule)) != std::string::npos) {
      outcome.status = RunOutcome::Status::kNotBuilt;
      return outcome;
    }
    outcome.status = RunOutcome::Status::kFailed;
    outcome.failure = line.empty() ? "exit status " + std::to_string(child.exit_code) : line;
    outcome.wall_s = child.wall_s;
    return outcome;
  }
  outcome.wall_s = child.wall_s;
  try {
    outcome.metrics = run_metrics(read_metrics_file(metrics_path));
    outcome.status = RunOutcome::Status::kOk;
  } catch (const UserError& e) {
    outcome.status = RunOutcome::Status::kFailed;
    outcome.failure = e.what();
  }
  return outcome;
}

// The approach's bubble ratio in the simulator: P ranks, M microbatches per step, F = I = W = 1;
// an asynchronous schedule over kCompareSimulatedSteps steps with no flush, its weight rule
// and its --dp's reductions as `pptrain schedule` gives them (prepare_schedule()).
double simulated_bubble(const Approach& a, int pp, int microbatches) {
  const ScheduleEntry& entry = find_schedule(a.schedule);
  CostModel cost = CostModel::parse("F=1,I=1,W=1");
  cost.replicas = a.dp;
  const bool asynchronous = entry.asynchronous();
  ScheduleOptions options;
  options.name = a.schedule;
  options.ranks = pp;
  options.microbatches = asynchronous ? kCompareSimulatedSteps * microbatches : microbatches;
  options.costs = cost.stage_costs(pp * resolve_chunks(entry, 0), pp);
  // options.period stays 0 (the whole list one period), as compare has always simulated; wpipe,
  // whose order depends on it, gets another bubble from `pptrain schedule`, which gives it M
  // (0.153 against 0.094 at P = 4, M = 8).
  ScheduleRequest request;
  request.schedule = a.schedule;
  request.microbatches = microbatches;
  request.dp = a.dp;
  const RequestedSchedule made = prepare_schedule(make_schedule(options), request);
  return simulate(made.validated, cost, made.rule, Record::kFigures).bubble_ratio;
}

bool in_registry(const std::string& schedule) {
  const std::vector<std::string> names = schedule_names();
  return std::find(names.begin(), names.end(), schedule) != names.end();
}

bool same_losses(const std::vector<double>& run, const std::vector<double>& reference) {
  if (run.size() != reference.size()) return false;
  for (size_t i = 0; i < run.size(); ++i) {
    if (!(std::abs(run[i] - reference[i]) <= kCompareSyncTolerance * std::abs(reference[i]))) {
      return false;
    }
  }
  return true;
}

void fill_measured(ApproachRow& row, const RunOutcome& reference, const RunOutcome* baseline,
                   int loss_at) {
  if (row.run.status != RunOutcome::Status::kOk) return;
  const RunMetrics& m = row.run.metrics;
  row.measured_bubble = median_of(after_first(m.bubble_ratio));
  row.final_loss = m.loss.back();
  if (loss_at <= static_cast<int>(m.loss.size())) row.loss_at = m.loss[loss_at - 1];
  if (reference.status == RunOutcome::Status::kOk) {
    const RunMetrics& r = reference.metrics;
    row.sync = same_losses(m.loss, r.loss);
    row.final_loss_ratio = ratio(row.final_loss, r.loss.back());
    if (loss_at <= static_cast<int>(r.loss.size())) {
      row.loss_at_ratio = ratio(row.loss_at, r.loss[loss_at - 1]);
    }
  }
  if (baseline && baseline->status == RunOutcome::Status::kOk) {
    const RunMetrics& b = baseline->metrics;
    row.memory_ratio = ratio(m.weights_optimizer_bytes, b.weights_optimizer_bytes);
    row.activation_ratio = ratio(m.peak_activation_bytes, b.peak_activation_bytes);
    row.compute_ratio = ratio(mean(after_first(m.compute_s)), mean(after_first(b.compute_s)));
    row.comm_ratio = ratio(mean(after_first(m.bytes_sent)), mean(after_first(b.bytes_sent)));
  }
}

// Where a measured "extra" column and the survey's mark disagree: > kCompareExtraThreshold
// without a mark, <= 1 with one.
void check_mark(std::vector<Disagreement>& out, const ApproachRow& row, const char* column,
                std::optional<double> measured, bool marked) {
  if (!measured) return;
  const char* name = row.approach.name.c_str();
  char text[256];
  if (marked && *measured <= 1.0) {
    std::snprintf(text, sizeof text, "%s: survey marks extra %s, measured %.2fx DAPPLE's", name,
                  column, *measured);
  } else if (!marked && *measured > kCompareExtraThreshold) {
    std::snprintf(text, sizeof text, "%s: survey has no extra %s, measured %.2fx DAPPLE's", name,
                  column, *measured);
  } else {
    return;
  }
  out.push_back({row.approach.name, column, text});
}

std::vector<Disagreement> disagreements(const std::vector<ApproachRow>& rows) {
  std::vector<Disagreement> out;
  for (const ApproachRow& row : rows) {
    const Approach& a = row.approach;
    if (row.sync && *row.sync != a.survey_sync) {
      out.push_back({a.name, "schedule",
                     a.name + ": survey says " + (a.survey_sync ? "Sync" : "Async") +
                         ", measured " + (*row.sync ? "sync" : "async") +
                         " (losses vs the --pp 1 run)"});
    }
    check_mark(out, row, "memory", row.memory_ratio, a.survey_extra_memory);
    check_mark(out, row, "compute", row.compute_ratio, a.survey_extra_compute);
    check_mark(out, row, "communication", row.comm_ratio, a.survey_extra_comm);
  }
  return out;
}

std::string progress_line(int index, int total, const std::string& what, const RunOutcome& run,
                          const std::string& pptrain) {
  char head[64];
  std::snprintf(head, sizeof head, "compare: [%d/%d] ", index, total);
  char tail[128];
  if (run.status == RunOutcome::Status::kNotBuilt) {
    return head + what + ": not built in " + pptrain;
  } else if (run.status == RunOutcome::Status::kFailed) {
    std::snprintf(tail, sizeof tail, ": failed after %.1f s: ", run.wall_s);
    return head + what + tail + run.failure;
  }
  std::snprintf(tail, sizeof tail, ": %.1f s, final loss %.4f", run.wall_s,
                run.metrics.loss.back());
  return head + what + tail;
}

}  // namespace

void check_compare_options(CompareOptions& o) {
  PPTRAIN_CHECK(o.model == "gpt" || o.model == "mlp", "--model must be gpt or mlp, got '", o.model,
                "'");
  PPTRAIN_CHECK(o.layers >= 1, "--layers must be >= 1, got ", o.layers);
  PPTRAIN_CHECK(o.d_model >= 1, "--d-model must be >= 1, got ", o.d_model);
  PPTRAIN_CHECK(o.heads >= 1, "--heads must be >= 1, got ", o.heads);
  PPTRAIN_CHECK(o.seq_len >= 1, "--seq-len must be >= 1, got ", o.seq_len);
  PPTRAIN_CHECK(o.pp >= 2 && o.pp <= 64, "--pp must be 2 .. 64, got ", o.pp);
  PPTRAIN_CHECK(o.microbatches >= 1, "--microbatches must be >= 1, got ", o.microbatches);
  // AvgPipe splits the batch over 2 copies of M microbatches each.
  PPTRAIN_CHECK(o.batch_size >= 1 && o.batch_size % (2 * o.microbatches) == 0,
                "--batch-size must be a positive multiple of 2 x --microbatches (AvgPipe runs 2 "
                "copies of the pipeline on half of it each), got ",
                o.batch_size, " with --microbatches ", o.microbatches);
  PPTRAIN_CHECK(o.steps >= 1, "--steps must be >= 1, got ", o.steps);
  if (o.loss_at == 0) o.loss_at = std::max(1, o.steps / 2);
  PPTRAIN_CHECK(o.loss_at >= 1 && o.loss_at <= o.steps, "--loss-at must be 1 .. --steps (", o.steps,
                "), got ", o.loss_at);
  PPTRAIN_CHECK(
      o.data == "default" || o.data == "synthetic" || std::filesystem::is_regular_file(o.data),
      "--data: no such file '", o.data, "' (or give 'default' or 'synthetic')");
  if (o.pptrain.empty()) {
    PPTRAIN_CHECK(o.this_program_trains,
                  "--pptrain PATH is required: this build of pptrain has no pptrain-runtime "
                  "(-DPPTRAIN_BUILD_RUNTIME=OFF) to train with");
    std::error_code error;
    o.pptrain = std::filesystem::read_symlink("/proc/self/exe", error).string();
    PPTRAIN_CHECK(!error, "--pptrain: cannot find this program (", error.message(), "); give it");
  }
  PPTRAIN_CHECK(std::filesystem::is_regular_file(o.pptrain) && access(o.pptrain.c_str(), X_OK) == 0,
                "--pptrain: '", o.pptrain, "' is not an executable file");
  select_approaches(survey_approaches(), o.only);
  PPTRAIN_CHECK(!o.out.empty(), "--out is required (the folder of compare.md and runs/)");
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(o.out) / "runs", error);
  PPTRAIN_CHECK(!error, "--out: cannot create '", o.out, "/runs': ", error.message());
}

std::vector<std::string> compare_command_line(const CompareOptions& o) {
  const CompareOptions defaults;
  std::vector<std::string> words = {"pptrain", "compare", "--out", o.out};
  const auto flag = [&](const char* name, const auto& value, const auto& default_value) {
    if (value == default_value) return;
    words.push_back(name);
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
      words.push_back(value);
    } else {
      words.push_back(std::to_string(value));
    }
  };
  if (o.only) words.insert(words.end(), {"--only", *o.only});
  flag("--pptrain", o.pptrain, defaults.pptrain);
  flag("--model", o.model, defaults.model);
  flag("--layers", o.layers, defaults.layers);
  flag("--d-model", o.d_model, defaults.d_model);
  flag("--heads", o.heads, defaults.heads);
  flag("--seq-len", o.seq_len, defaults.seq_len);
  flag("--data", o.data, defaults.data);
  flag("--pp", o.pp, defaults.pp);
  flag("--batch-size", o.batch_size, defaults.batch_size);
  flag("--microbatches", o.microbatches, defaults.microbatches);
  flag("--steps", o.steps, defaults.steps);
  flag("--seed", o.seed, defaults.seed);
  flag("--loss-at", o.loss_at, defaults.loss_at);
  return words;
}

CompareResult run_compare(CompareOptions options,
                          const std::function<void(const std::string& line)>& progress) {
  if (options.command.empty()) options.command = compare_command_line(options);
  check_compare_options(options);
  CompareResult result;
  result.options = options;
  const CompareOptions& o = result.options;
  const std::vector<Approach> selected = select_approaches(survey_approaches(), o.only);

  const int total = static_cast<int>(selected.size()) + 1;
  int index = 0;
  const auto report = [&](const std::string& what, const RunOutcome& run) {
    ++index;
    if (progress) progress(progress_line(index, total, what, run, o.pptrain));
  };

  result.reference = train_run(o, kReferenceName, 1, kCompareBaselineSchedule, 1);
  report("reference (--pp 1 --schedule 1f1b)", result.reference);

  for (const Approach& a : selected) {
    ApproachRow row;
    row.approach = a;
    if (in_registry(a.schedule)) {
      try {
        row.simulated_bubble = simulated_bubble(a, o.pp, o.microbatches);
      } catch (const UserError& e) {
        row.simulation_error = e.what();
      }
    } else {
      row.simulation_error = "not in this program's schedule registry";
    }
    row.run = train_run(o, a.schedule, o.pp, a.schedule, a.dp);
    report(a.name + " (" + a.schedule + ")", row.run);
    result.rows.push_back(std::move(row));
  }

  const RunOutcome* baseline = nullptr;
  for (const ApproachRow& row : result.rows) {
    if (row.approach.schedule == kCompareBaselineSchedule) baseline = &row.run;
  }
  for (ApproachRow& row : result.rows) fill_measured(row, result.reference, baseline, o.loss_at);
  result.disagreements = disagreements(result.rows);
  return result;
}

std::string status_text(const ApproachRow& row) {
  switch (row.run.status) {
    case RunOutcome::Status::kOk:
      return row.sync ? (*row.sync ? "sync" : "async") : "n/a";
    case RunOutcome::Status::kFailed:
      return "failed: " + row.run.failure;
    case RunOutcome::Status::kNotBuilt:
      return "not built";
    case RunOutcome::Status::kNotRun:
      break;
  }
  return "not run";
}

}  // namespace pptrain
