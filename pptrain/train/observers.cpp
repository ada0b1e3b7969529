#include "pptrain/train/observers.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"

namespace pptrain {
namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

std::vector<double> measured_peaks(const StepReport& report) {
  return {report.peak_memory_bytes.begin(), report.peak_memory_bytes.end()};
}

}  // namespace

void LogPrinter::on_start(const RunInfo& run) {
  std::printf("%s\n", run.header.c_str());
  std::fflush(stdout);
}

void LogPrinter::on_step(const StepReport& r) {
  std::string peaks;
  for (auto bytes : r.peak_activation_bytes) peaks += (peaks.empty() ? "" : "/") + mib(bytes);
  const std::string of = r.steps > 0 ? "/" + std::to_string(r.steps) : "";
  std::printf("step %d%s  loss %.6f  time %.4f s  %.0f tokens/s  bubble %.3f  peak act %s MiB\n",
              r.step, of.c_str(), r.loss, r.step_seconds, r.tokens_per_s, r.stats.bubble_ratio,
              peaks.c_str());
  std::fflush(stdout);
}

void LogPrinter::on_end(const RunInfo& run) {
  if (run.save_dir.empty()) return;
  std::printf("saved a checkpoint of step %d to %s (parameters and optimizer state per layer)\n",
              run.steps, run.save_dir.c_str());
  std::fflush(stdout);
}

void MeasuredSteps::start(const RunInfo& run) {
  schedule_ = run.schedule;
  seen_ = 0;
  warmup_.reset();
  steps_.clear();
}

void MeasuredSteps::add(const StepReport& report) {
  if (++seen_ == 1) {
    warmup_ = report.timeline;
    return;
  }
  if (steps_.size() == kept_) steps_.erase(steps_.begin());
  steps_.push_back(report.timeline);
}

std::optional<Comparison> MeasuredSteps::compare(bool or_warmup) const {
  if (!schedule_) return std::nullopt;
  if (!steps_.empty()) return compare_to_simulation(*schedule_, steps_);
  if (or_warmup && warmup_) return compare_to_simulation(*schedule_, {*warmup_});
  return std::nullopt;
}

void SimComparison::on_step(const StepReport& report) {
  steps_.add(report);
  if (!report.last()) return;
  result_ = steps_.compare(/*or_warmup=*/true);  // a run of one step is compared on it
  std::printf("%s", format_comparison(*result_).c_str());
  std::printf("%s", format_memory(report.predicted_memory, measured_peaks(report)).c_str());
  std::fflush(stdout);
}

MetricsWriter::MetricsWriter(std::string path, const SimComparison* comparison)
    : path_(std::move(path)), comparison_(comparison) {}

void MetricsWriter::on_start(const RunInfo& run) {
  // A run that moved to a new cut (--replan auto) or that its launcher started again goes on
  // appending, in whichever process reports now: each line at the file's end, after another
  // process's. Only a run's first start begins the file anew.
  if (out_.is_open()) out_.close();
  out_.open(path_, run.continues || run.restart > 0 ? std::ios::app : std::ios::trunc);
  PPTRAIN_CHECK(out_.good(), "cannot write --metrics file '", path_, "'");
  // What every line of this start carries: its links, its restart and its layout.
  run_fields_ = nlohmann::ordered_json::object();
  if (!run.links.empty()) {
    nlohmann::ordered_json links = nlohmann::ordered_json::object();
    for (const auto& [pair, link] : run.links) links[pair] = link;
    run_fields_["links"] = links;
  }
  run_fields_["restart"] = run.restart;
  nlohmann::ordered_json layout = {
      {"pp", run.ranks()}, {"dp", run.copies}, {"stages", run.schedule->num_stages}};
  if (!run.stage_layers.empty()) layout["stage_layers"] = run.stage_layers;
  run_fields_["layout"] = layout;
}

StepMetrics step_metrics(const StepReport& r) {
  StepMetrics m;
  m.step = r.step;
  m.loss = r.loss;
  m.step_time_s = r.step_seconds;
  m.samples_per_s = r.samples_per_s;
  m.tokens_per_s = r.tokens_per_s;
  m.bubble_ratio = r.stats.bubble_ratio;
  m.grad_norm = r.grad_norm;
  m.peak_activation_bytes = r.peak_activation_bytes;
  m.weight_versions = r.weight_versions;
  m.optimizer_state_bytes = r.optimizer_state_bytes;
  m.compute_s = r.compute_s;
  m.bytes_sent = r.bytes_sent;
  m.weight_bytes = r.weight_bytes;
  m.rollbacks = r.rollbacks;
  m.checkpoint_stall_s = r.checkpoint_stall_s;
  m.resident_bytes = r.resident_bytes;
  m.peak_memory_bytes = r.peak_memory_bytes;
  m.predicted_peak_memory_bytes = r.predicted_peak_memory_bytes;
  if (r.loss_scale > 0) m.loss_scale = r.loss_scale;
  m.skipped = r.skipped;
  return m;
}

void MetricsWriter::on_step(const StepReport& r) {
  nlohmann::ordered_json line = to_json(step_metrics(r));
  for (const auto& [name, value] : run_fields_.items()) line[name] = value;
  if (r.last() && comparison_ && comparison_->result()) {
    line["compare_sim"] = comparison_json(*comparison_->result());
    line["compare_sim"]["memory"] = memory_json(r.predicted_memory, measured_peaks(r));
  }
  out_ << line.dump() << "\n";
  out_.flush();
}

void TraceWriter::on_step(const StepReport& report) {
  latest_ = report.timeline;
}

void TraceWriter::on_end(const RunInfo&) {
  if (latest_) write_text_file(path_, render_chrome_trace(*latest_), "--trace file");
}

SvgWriter::SvgWriter(std::string path, const SimComparison* comparison)
    : path_(std::move(path)), comparison_(comparison) {}

void SvgWriter::on_start(const RunInfo& run) {
  run_ = run.title();
}

void SvgWriter::on_step(const StepReport& report) {
  latest_ = report;
}

void SvgWriter::on_end(const RunInfo&) {
  if (!latest_) return;
  const StepReport& report = *latest_;
  SvgOptions svg;
  svg.show_comms = true;
  if (!comparison_ || !comparison_->result()) {
    write_text_file(path_, render_svg(report.timeline, svg), "--svg file");
    return;
  }
  // Measured above predicted, on one time axis.
  const Timeline& measured = report.timeline;
  svg.title = run_ + ": measured step " + std::to_string(report.step) +
              " above its prediction from the run's own costs";
  svg.labels = {"measured", "predicted"};
  write_text_file(path_, render_svg({measured, comparison_->result()->predicted.timeline}, svg),
                  "--svg file");
}

std::vector<std::unique_ptr<StepObserver>> make_observers(const TrainOptions& options) {
  std::vector<std::unique_ptr<StepObserver>> observers;
  if (!options.quiet) observers.push_back(std::make_unique<LogPrinter>());
  SimComparison* comparison = nullptr;
  if (options.compare_sim) {
    auto owned = std::make_unique<SimComparison>();
    comparison = owned.get();
    observers.push_back(std::move(owned));
  }
  if (!options.metrics_path.empty()) {
    observers.push_back(std::make_unique<MetricsWriter>(options.metrics_path, comparison));
  }
  if (!options.trace_path.empty()) {
    observers.push_back(std::make_unique<TraceWriter>(options.trace_path));
  }
  if (!options.svg_path.empty()) {
    observers.push_back(std::make_unique<SvgWriter>(options.svg_path, comparison));
  }
  return observers;
}

}  // namespace pptrain
