// One training step's figures as a line of `pptrain train --metrics FILE` (JSON lines, one per
// step): the one place that says what a line holds. The runtime's MetricsWriter
// (train/observers.h) writes it and `pptrain compare` (compare/) reads it back.
//
//   out << to_json(metrics).dump() << "\n";                      // the runtime, every step
//   std::vector<StepMetrics> run = read_metrics_file("m.jsonl");  // a reader, after the run
//
// A line's keys are the fields below, in their order. A reader needs only loss, bubble_ratio,
// peak_activation_bytes and optimizer_state_bytes; a line without compute_s, bytes_sent or
// weight_bytes (an older runtime's) reads as absent (empty optional), and any other field it
// lacks as 0 or empty.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace pptrain {

struct StepMetrics {
  int step = 0;                                      // 1-based
  double loss = 0;                                   // mean over the mini-batch
  double step_time_s = 0;                            // the slowest rank's
  double samples_per_s = 0;                          // batch size / step_time_s
  double tokens_per_s = 0;                           // samples_per_s x tokens per sample
  double bubble_ratio = 0;                           // of the measured timeline (sim/metrics.h)
  double grad_norm = 0;                              // global, before clipping
  std::vector<int64_t> peak_activation_bytes;        // [rank]
  std::vector<int> weight_versions;                  // [rank]: most versions held at once
  std::vector<int64_t> optimizer_state_bytes;        // [rank]: after the step
  std::optional<std::vector<double>> compute_s;      // [rank]: CPU seconds of F, I, W, B
  std::optional<std::vector<int64_t>> bytes_sent;    // [rank]: messages and collectives
  std::optional<std::vector<int64_t>> weight_bytes;  // [rank]: most bytes of weights at once
  int rollbacks = 0;                                 // ranks that took their step back
  double checkpoint_stall_s = 0;                     // the longest wait for a checkpoint
  std::vector<int64_t> resident_bytes;               // [rank]: RSS at the step's end
  std::vector<int64_t> peak_memory_bytes;            // [rank]: the counting allocator's
  std::vector<int64_t> predicted_peak_memory_bytes;  // [rank]: the memory model's
  // fp16 runs only (written only then): the loss scale the step ran at, and whether every rank
  // skipped its optimizer step because the gradients overflowed.
  std::optional<double> loss_scale;
  bool skipped = false;
};

// The line's object, keys in the order above (an absent optional is left out).
nlohmann::ordered_json to_json(const StepMetrics& metrics);

// One line read back. nlohmann::json::exception for a line that is not JSON or lacks a field a
// reader needs (read_metrics_file() turns it into a UserError naming the file and line).
StepMetrics step_metrics_from_json(const std::string& line);

// Every step of a metrics file, blank lines skipped. UserError naming the file (and the line)
// when it cannot be read, a line is not a step's, or it holds no step.
std::vector<StepMetrics> read_metrics_file(const std::string& path);

}  // namespace pptrain
