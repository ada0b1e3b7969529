#include "pptrain/compare/report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "pptrain/common/files.h"
#include "pptrain/render/line_chart.h"

namespace pptrain {
namespace {

std::string format(std::optional<double> value, const char* spec = "%.2f") {
  if (!value) return "n/a";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, spec, *value);
  return buffer;
}

nlohmann::ordered_json to_json(std::optional<double> value) {
  return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
}

// A shell word for the header's command line.
std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789-_./=,:+@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Markdown cells cannot hold '|' or a newline.
std::string cell(std::string text) {
  for (char& c : text) {
    if (c == '|') c = '/';
    if (c == '\n') c = ' ';
  }
  return text;
}

bool ok(const RunOutcome& run) {
  return run.status == RunOutcome::Status::kOk;
}

std::string config_text(const CompareOptions& o) {
  std::ostringstream out;
  out << "--model " << o.model << " --layers " << o.layers << " --d-model " << o.d_model
      << " --heads " << o.heads << " --seq-len " << o.seq_len << " --data " << o.data
      << " --batch-size " << o.batch_size << " --microbatches " << o.microbatches << " --steps "
      << o.steps << " --seed " << o.seed;
  return out.str();
}

// The run's `pptrain train` flags beyond the configuration: " --dp 2" for copies.
std::string dp_flag(const Approach& a) {
  return a.dp > 1 ? " --dp " + std::to_string(a.dp) : "";
}

std::string table_row(const ApproachRow& row) {
  const Approach& a = row.approach;
  const auto survey = [](bool x) { return x ? " [X]" : " [ ]"; };
  std::ostringstream out;
  out << "| " << a.name << " | `" << a.schedule << "`" << dp_flag(a) << " | "
      << cell(status_text(row)) << " [" << (a.survey_sync ? "Sync" : "Async") << "] | "
      << format(row.simulated_bubble, "%.3f") << " / " << format(row.measured_bubble, "%.3f")
      << " | " << format(row.final_loss_ratio, "%.3f") << " | " << format(row.loss_at_ratio, "%.3f")
      << " | [" << a.survey_convergence << "] | " << format(row.memory_ratio)
      << survey(a.survey_extra_memory) << " | " << format(row.activation_ratio) << " | "
      << format(row.compute_ratio) << survey(a.survey_extra_compute) << " | "
      << format(row.comm_ratio) << survey(a.survey_extra_comm) << " | "
      << (row.run.status == RunOutcome::Status::kNotBuilt ? "" : format(row.run.wall_s, "%.1f"))
      << " |\n";
  return out.str();
}

}  // namespace

std::string compare_markdown(const CompareResult& result) {
  const CompareOptions& o = result.options;
  const RunOutcome& reference = result.reference;
  std::string command;
  for (const std::string& word : o.command)
    command += (command.empty() ? "" : " ") + shell_quote(word);
  std::ostringstream out;
  out << "# Pipeline approaches, measured\n\n";
  out << "Command:\n\n```\n" << command << "\n```\n\n";
  out << "Configuration: `" << config_text(o) << "`, each approach `pptrain train ... --pp " << o.pp
      << " --schedule S` (AvgPipe with `--dp 2`), trained by `" << o.pptrain
      << "`; reference `--pp 1 --schedule 1f1b`";
  if (ok(reference)) {
    out << " (final loss " << format(reference.metrics.loss.back(), "%.4f") << ", "
        << format(reference.wall_s, "%.1f") << " s)";
  } else {
    out << " (**failed: " << cell(reference.failure) << "**)";
  }
  out << ".\n\n";
  const bool has_baseline =
      std::any_of(result.rows.begin(), result.rows.end(), [](const ApproachRow& row) {
        return row.approach.schedule == kCompareBaselineSchedule && ok(row.run);
      });
  if (!has_baseline) {
    out << "**DAPPLE (`1f1b`) did not run here, so the memory, activation, compute and "
           "communication ratios are n/a.**\n\n";
  }
  out << "Ratios are to DAPPLE's run (`1f1b`, same pipeline) unless said. Schedule: sync when "
         "every step's loss equals the `--pp 1` run's to 1e-5 relative. Bubble: simulated "
         "(F = I = W = 1; asynchronous schedules over "
      << kCompareSimulatedSteps
      << " steps without a flush) / measured (median of the steps after the first). Loss ratios "
         "are to the `--pp 1` run's. Memory: max over ranks of weight + optimizer-state bytes; "
         "activations: peak activation bytes, max over ranks. Compute and communication: mean "
         "over the steps after the first of the sum over ranks of compute_s and bytes_sent. In "
         "brackets: the survey's marks.\n\n";
  out << "| Approach | `--schedule` | Schedule [survey] | Bubble sim / measured | Final loss / "
         "pp1 | Loss@"
      << o.loss_at
      << " / pp1 | Convergence [survey] | Memory [survey] | Activations | Compute [survey] | "
         "Communication [survey] | Wall s |\n";
  out << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const ApproachRow& row : result.rows) out << table_row(row);
  out << "\n## Disagrees with the survey\n\n";
  out << "An extra column disagrees when the measured ratio is above " << kCompareExtraThreshold
      << " without the survey's X, or at most 1.00 with it; the schedule when the measured "
         "sync/async differs from the survey's.\n\n";
  if (result.disagreements.empty()) out << "Nothing measured disagrees.\n";
  for (const Disagreement& d : result.disagreements) out << "- " << d.text << "\n";
  return out.str();
}

nlohmann::ordered_json compare_json(const CompareResult& result) {
  const CompareOptions& o = result.options;
  const RunOutcome& reference = result.reference;
  nlohmann::ordered_json out;
  out["command"] = o.command;
  nlohmann::ordered_json& config = out["config"];
  config["model"] = o.model;
  config["layers"] = o.layers;
  config["d_model"] = o.d_model;
  config["heads"] = o.heads;
  config["seq_len"] = o.seq_len;
  config["data"] = o.data;
  config["pp"] = o.pp;
  config["batch_size"] = o.batch_size;
  config["microbatches"] = o.microbatches;
  config["steps"] = o.steps;
  config["seed"] = o.seed;
  config["loss_at"] = o.loss_at;
  config["pptrain"] = o.pptrain;
  config["simulated_steps_async"] = kCompareSimulatedSteps;
  nlohmann::ordered_json& ref = out["reference"];
  ref["status"] = ok(reference) ? "ok" : "failed";
  ref["failure"] = reference.failure;
  ref["wall_s"] = reference.wall_s;
  ref["final_loss"] = ok(reference) ? nlohmann::ordered_json(reference.metrics.loss.back())
                                    : nlohmann::ordered_json(nullptr);
  out["approaches"] = nlohmann::ordered_json::array();
  for (const ApproachRow& row : result.rows) {
    const Approach& a = row.approach;
    nlohmann::ordered_json r;
    r["approach"] = a.name;
    r["schedule"] = a.schedule;
    r["dp"] = a.dp;
    r["status"] = status_text(row);
    r["wall_s"] = row.run.wall_s;
    nlohmann::ordered_json& m = r["measured"];
    m["schedule"] = row.sync ? nlohmann::ordered_json(*row.sync ? "sync" : "async")
                             : nlohmann::ordered_json(nullptr);
    m["bubble_ratio_simulated"] = to_json(row.simulated_bubble);
    m["simulation_error"] = row.simulation_error;
    m["bubble_ratio_measured"] = to_json(row.measured_bubble);
    m["final_loss"] = to_json(row.final_loss);
    m["loss_at"] = to_json(row.loss_at);
    m["final_loss_ratio"] = to_json(row.final_loss_ratio);
    m["loss_at_ratio"] = to_json(row.loss_at_ratio);
    m["memory_ratio"] = to_json(row.memory_ratio);
    m["activation_ratio"] = to_json(row.activation_ratio);
    m["compute_ratio"] = to_json(row.compute_ratio);
    m["communication_ratio"] = to_json(row.comm_ratio);
    nlohmann::ordered_json& s = r["survey"];
    s["schedule"] = a.survey_sync ? "sync" : "async";
    s["convergence"] = a.survey_convergence;
    s["extra_memory"] = a.survey_extra_memory;
    s["extra_compute"] = a.survey_extra_compute;
    s["extra_communication"] = a.survey_extra_comm;
    out["approaches"].push_back(std::move(r));
  }
  out["disagreements"] = nlohmann::ordered_json::array();
  for (const Disagreement& d : result.disagreements) {
    out["disagreements"].push_back(
        {{"approach", d.approach}, {"column", d.column}, {"text", d.text}});
  }
  return out;
}

std::string compare_losses_svg(const CompareResult& result) {
  std::vector<LineSeries> series;
  // A row keeps its colour whether or not the rows before it ran.
  for (size_t i = 0; i < result.rows.size(); ++i) {
    const ApproachRow& row = result.rows[i];
    if (ok(row.run)) {
      series.push_back({row.approach.name, row.run.metrics.loss, line_chart_colour(i), false});
    }
  }
  // Last, dashed: a synchronous run's line lies under it and still shows.
  if (ok(result.reference)) {
    series.push_back({"reference (--pp 1)", result.reference.metrics.loss, "black", true});
  }
  LineChartOptions chart;
  chart.title = "Training loss per step";
  chart.x_label = "step";
  chart.y_label = "loss";
  chart.x_count = result.options.steps;
  return render_line_chart(series, chart);
}

std::vector<std::string> write_compare_files(const CompareResult& result) {
  const std::filesystem::path out(result.options.out);
  const std::vector<std::string> paths = {(out / "compare.md").string(),
                                          (out / "compare.json").string(),
                                          (out / "losses.svg").string()};
  write_text_file(paths[0], compare_markdown(result), "--out file");
  write_text_file(paths[1], compare_json(result).dump(2) + "\n", "--out file");
  write_text_file(paths[2], compare_losses_svg(result), "--out file");
  return paths;
}

}  // namespace pptrain
