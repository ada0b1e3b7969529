#include "pptrain/sim/step_metrics.h"

#include <sstream>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"

namespace pptrain {
namespace {

// `field` of `line` into `value` when the line has it.
template <typename T>
void read_if_present(const nlohmann::json& line, const char* field, T& value) {
  if (line.contains(field)) line[field].get_to(value);
}

// An optional per-rank list: absent unless the line has it as a list.
template <typename T>
void read_list_if_present(const nlohmann::json& line, const char* field,
                          std::optional<std::vector<T>>& value) {
  if (line.contains(field) && line[field].is_array()) value = line[field].get<std::vector<T>>();
}

}  // namespace

nlohmann::ordered_json to_json(const StepMetrics& m) {
  nlohmann::ordered_json line = {{"step", m.step},
                                 {"loss", m.loss},
                                 {"step_time_s", m.step_time_s},
                                 {"samples_per_s", m.samples_per_s},
                                 {"tokens_per_s", m.tokens_per_s},
                                 {"bubble_ratio", m.bubble_ratio},
                                 {"grad_norm", m.grad_norm},
                                 {"peak_activation_bytes", m.peak_activation_bytes},
                                 {"weight_versions", m.weight_versions},
                                 {"optimizer_state_bytes", m.optimizer_state_bytes}};
  if (m.compute_s) line["compute_s"] = *m.compute_s;
  if (m.bytes_sent) line["bytes_sent"] = *m.bytes_sent;
  if (m.weight_bytes) line["weight_bytes"] = *m.weight_bytes;
  line["rollbacks"] = m.rollbacks;
  line["checkpoint_stall_s"] = m.checkpoint_stall_s;
  line["resident_bytes"] = m.resident_bytes;
  line["peak_memory_bytes"] = m.peak_memory_bytes;
  line["predicted_peak_memory_bytes"] = m.predicted_peak_memory_bytes;
  if (m.loss_scale) {
    line["loss_scale"] = *m.loss_scale;
    line["skipped"] = m.skipped;
  }
  return line;
}

StepMetrics step_metrics_from_json(const std::string& text) {
  const nlohmann::json line = nlohmann::json::parse(text);
  StepMetrics m;
  m.loss = line.at("loss").get<double>();
  m.bubble_ratio = line.at("bubble_ratio").get<double>();
  line.at("peak_activation_bytes").get_to(m.peak_activation_bytes);
  line.at("optimizer_state_bytes").get_to(m.optimizer_state_bytes);
  read_if_present(line, "step", m.step);
  read_if_present(line, "step_time_s", m.step_time_s);
  read_if_present(line, "samples_per_s", m.samples_per_s);
  read_if_present(line, "tokens_per_s", m.tokens_per_s);
  read_if_present(line, "grad_norm", m.grad_norm);
  read_if_present(line, "weight_versions", m.weight_versions);
  read_list_if_present(line, "compute_s", m.compute_s);
  read_list_if_present(line, "bytes_sent", m.bytes_sent);
  read_list_if_present(line, "weight_bytes", m.weight_bytes);
  read_if_present(line, "rollbacks", m.rollbacks);
  read_if_present(line, "checkpoint_stall_s", m.checkpoint_stall_s);
  read_if_present(line, "resident_bytes", m.resident_bytes);
  read_if_present(line, "peak_memory_bytes", m.peak_memory_bytes);
  read_if_present(line, "predicted_peak_memory_bytes", m.predicted_peak_memory_bytes);
  if (line.contains("loss_scale")) m.loss_scale = line["loss_scale"].get<double>();
  read_if_present(line, "skipped", m.skipped);
  return m;
}

std::vector<StepMetrics> read_metrics_file(const std::string& path) {
  std::istringstream in(read_text_file(path, "metrics file"));
  std::vector<StepMetrics> steps;
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.empty()) continue;
    try {
      steps.push_back(step_metrics_from_json(text));
    } catch (const nlohmann::json::exception& e) {
      PPTRAIN_CHECK(false, "metrics file '", path, "' line ", number, ": ", e.what());
    }
  }
  PPTRAIN_CHECK(!steps.empty(), "metrics file '", path, "' has no step");
  return steps;
}

}  // namespace pptrain
