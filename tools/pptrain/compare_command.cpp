// `pptrain compare`: the survey's table of pipeline approaches, measured. Trains one
// configuration with each approach (one `pptrain train` child process after the other, the
// machine being small), plus one --pp 1 reference run, reads their metrics files and writes the
// survey's columns as measured figures beside the survey's own marks:
//
//   pptrain compare --out cmp                               # 14 approaches, 300 steps each
//   pptrain compare --out cmp --only 1f1b,pipedream --steps 3 --pptrain build/tools/pptrain/pptrain
//
// Writes OUT/compare.md (command, configuration, table, where it disagrees with the survey),
// OUT/compare.json (the same data), OUT/losses.svg (every run's loss per step) and each run's
// metrics as OUT/runs/<schedule>.jsonl (its stdout and stderr beside them). A run that fails is
// a row marked "failed: <first line of its stderr>"; an approach the binary does not know
// (`schedule --list`) is a row marked "not built".
//
// What each column measures (ratios are to DAPPLE's run, i.e. 1f1b on the same pipeline):
//   schedule     "sync" when every step's loss equals the --pp 1 run's to 1e-5 relative
//   bubble       the simulator's (unit costs F = I = W = 1; an asynchronous schedule over
//                kSimulatedSteps steps without a flush, as `pptrain schedule`) and the median
//                over the steps after the first of the metrics' bubble_ratio
//   convergence  final loss and the loss at --loss-at, each / the --pp 1 run's
//   memory       max over steps and ranks of weight_bytes + optimizer_state_bytes; peak
//                activation bytes (max over ranks and steps) in a column of its own
//   compute      mean over the steps after the first of the sum over ranks of compute_s
//   comm         mean over the steps after the first of the sum over ranks of bytes_sent
// A metrics field the runtime does not write (compute_s, bytes_sent, weight_bytes are recent)
// gives "n/a".
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/schedule/registry.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/cost_model.h"
#include "pptrain/sim/simulator.h"
#include "tools/pptrain/commands.h"

extern char** environ;

namespace pptrain::cli {
namespace {

// PPTRAIN_RUNTIME_BINARY is empty when this build has no pptrain-runtime (main.cpp).
constexpr bool kHasRuntime = sizeof(PPTRAIN_RUNTIME_BINARY) > 1;

// Steps of M microbatches an asynchronous schedule is simulated over (`pptrain schedule`'s
// default --steps): its steady state crosses step boundaries.
constexpr int kSimulatedSteps = 3;
// Two losses are "equal" (a synchronous schedule) within this relative difference.
constexpr double kSyncTolerance = 1e-5;
// A measured ratio above this is "extra" where the survey has no mark.
constexpr double kExtraThreshold = 1.05;

// One row of the survey's table: its name, how pptrain runs it, and the survey's marks.
struct Approach {
  const char* name;      // the survey's
  const char* schedule;  // pptrain train --schedule
  int dp;                // pptrain train --dp (copies of the pipeline)
  bool survey_sync;      // the survey's Schedule column: Sync (true) or Async
  const char* survey_convergence;
  bool survey_extra_memory, survey_extra_compute, survey_extra_comm;  // the survey's X marks
};

constexpr Approach kApproaches[] = {
    {"GPipe", "gpipe", 1, true, "Excellent", false, false, false},
    {"GEMS", "gems", 1, true, "Excellent", true, false, true},
    {"DAPPLE", "1f1b", 1, true, "Excellent", false, false, false},
    {"Chimera", "chimera", 1, true, "Excellent", true, false, true},
    {"Megatron-LM", "interleaved-1f1b", 1, true, "Excellent", false, false, true},
    {"ZeroBubble", "zb-h2", 1, true, "Excellent", false, true, false},
    {"AMPNet", "ampnet", 1, false, "Poor", false, false, false},
    {"PipeDream", "pipedream", 1, false, "Good", true, false, false},
    {"XPipe", "xpipe", 1, false, "Good", true, true, false},
    {"SpecTrain", "spectrain", 1, false, "Good", true, true, false},
    {"PipeDream-2BW", "2bw", 1, false, "Good", true, false, false},
    {"PipeMare", "pipemare", 1, false, "Good", true, true, false},
    {"AvgPipe", "avgpipe", 2, false, "Good", true, false, true},
    {"WPipe", "wpipe", 1, false, "Good", true, false, false},
};
// The row every ratio is relative to.
constexpr const char* kBaselineSchedule = "1f1b";
// The reference run's file name under OUT/runs.
constexpr const char* kReferenceName = "reference-pp1";

struct CompareArgs {
  std::string model = "gpt";
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
  std::string pptrain;  // the binary that trains; empty: this program
  std::string out;
  std::string only;  // comma list of approach or schedule names; empty: all
  bool only_given = false;
  int loss_at = 0;  // step of the second convergence column; 0: steps / 2
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
  double wall_s = 0;
  RunMetrics metrics;
};

// One approach's row: the run and what was made of it.
struct Row {
  const Approach* approach = nullptr;
  RunOutcome run;
  std::optional<double> simulated_bubble;
  std::string simulation_error;  // why simulated_bubble is absent
  std::optional<bool> sync;      // measured; absent without both runs
  std::optional<double> measured_bubble, final_loss, loss_at;
  std::optional<double> final_loss_ratio, loss_at_ratio;
  std::optional<double> memory_ratio, activation_ratio, compute_ratio, comm_ratio;
};

struct Disagreement {
  std::string approach, column, text;
};

// --- small helpers ---

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string first_line(const std::string& text) {
  const size_t begin = text.find_first_not_of("\n\r ");
  if (begin == std::string::npos) return "";
  const size_t end = text.find('\n', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
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

// This process's command line, as typed (/proc/self/cmdline).
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  std::string word;
  while (std::getline(in, word, '\0')) words.push_back(word);
  return words;
}

std::string join(const std::vector<std::string>& words, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < words.size(); ++i) text += (i ? separator : "") + words[i];
  return text;
}

// --- arguments ---

// The approaches --only names (an approach's name, any case, or its schedule), in table order.
std::vector<const Approach*> selected_approaches(const std::string& only) {
  std::vector<const Approach*> selected;
  if (only.empty()) {
    for (const Approach& a : kApproaches) selected.push_back(&a);
    return selected;
  }
  std::vector<bool> wanted(std::size(kApproaches), false);
  std::stringstream pieces(only);
  std::string piece;
  while (std::getline(pieces, piece, ',')) {
    bool found = false;
    for (size_t i = 0; i < std::size(kApproaches); ++i) {
      if (lower(piece) == lower(kApproaches[i].name) || piece == kApproaches[i].schedule) {
        wanted[i] = found = true;
      }
    }
    if (!found) {
      std::vector<std::string> names;
      for (const Approach& a : kApproaches)
        names.push_back(a.name + std::string(" (") + a.schedule + ")");
      PPTRAIN_CHECK(false, "--only: unknown approach '", piece, "' (expected a comma list of ",
                    join(names, ", "), ")");
    }
  }
  PPTRAIN_CHECK(only.back() != ',', "--only: empty name in '", only, "'");
  for (size_t i = 0; i < std::size(kApproaches); ++i) {
    if (wanted[i]) selected.push_back(&kApproaches[i]);
  }
  return selected;
}

// Every user mistake, before any run starts. Fills in the defaults that depend on others.
void check_args(CompareArgs& args) {
  PPTRAIN_CHECK(args.model == "gpt" || args.model == "mlp", "--model must be gpt or mlp, got '",
                args.model, "'");
  PPTRAIN_CHECK(args.layers >= 1, "--layers must be >= 1, got ", args.layers);
  PPTRAIN_CHECK(args.d_model >= 1, "--d-model must be >= 1, got ", args.d_model);
  PPTRAIN_CHECK(args.heads >= 1, "--heads must be >= 1, got ", args.heads);
  PPTRAIN_CHECK(args.seq_len >= 1, "--seq-len must be >= 1, got ", args.seq_len);
  PPTRAIN_CHECK(args.pp >= 2 && args.pp <= 64, "--pp must be 2 .. 64, got ", args.pp);
  PPTRAIN_CHECK(args.microbatches >= 1, "--microbatches must be >= 1, got ", args.microbatches);
  // AvgPipe splits the batch over 2 copies of M microbatches each.
  PPTRAIN_CHECK(args.batch_size >= 1 && args.batch_size % (2 * args.microbatches) == 0,
                "--batch-size must be a positive multiple of 2 x --microbatches (AvgPipe runs 2 "
                "copies of the pipeline on half of it each), got ",
                args.batch_size, " with --microbatches ", args.microbatches);
  PPTRAIN_CHECK(args.steps >= 1, "--steps must be >= 1, got ", args.steps);
  if (args.loss_at == 0) args.loss_at = std::max(1, args.steps / 2);
  PPTRAIN_CHECK(args.loss_at >= 1 && args.loss_at <= args.steps, "--loss-at must be 1 .. --steps (",
                args.steps, "), got ", args.loss_at);
  PPTRAIN_CHECK(args.data == "default" || args.data == "synthetic" ||
                    std::filesystem::is_regular_file(args.data),
                "--data: no such file '", args.data, "' (or give 'default' or 'synthetic')");
  if (args.pptrain.empty()) {
    PPTRAIN_CHECK(kHasRuntime,
                  "--pptrain PATH is required: this build of pptrain has no pptrain-runtime "
                  "(-DPPTRAIN_BUILD_RUNTIME=OFF) to train with");
    std::error_code error;
    args.pptrain = std::filesystem::read_symlink("/proc/self/exe", error).string();
    PPTRAIN_CHECK(!error, "--pptrain: cannot find this program (", error.message(), "); give it");
  }
  PPTRAIN_CHECK(
      std::filesystem::is_regular_file(args.pptrain) && access(args.pptrain.c_str(), X_OK) == 0,
      "--pptrain: '", args.pptrain, "' is not an executable file");
  PPTRAIN_CHECK(!args.only_given || !args.only.empty(),
                "--only: no approach named (give a comma list, e.g. 1f1b,pipedream)");
  selected_approaches(args.only);
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(args.out) / "runs", error);
  PPTRAIN_CHECK(!error, "--out: cannot create '", args.out, "/runs': ", error.message());
}

// --- runs ---

struct ChildResult {
  int exit_code = 0;  // 128 + signal for a signal
  double wall_s = 0;
};

// Runs `argv` with stdout and stderr to the files, stdin from /dev/null, and waits for it.
ChildResult run_child(const std::vector<std::string>& argv, const std::string& stdout_path,
                      const std::string& stderr_path) {
  std::vector<char*> pointers;
  for (const std::string& word : argv) pointers.push_back(const_cast<char*>(word.c_str()));
  pointers.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, pointers.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ChildResult result;
  if (spawned != 0) {
    result.exit_code = 127;
    write_text_file(stderr_path, "cannot run " + argv[0] + ": " + std::strerror(spawned) + "\n",
                    "run's stderr file");
    return result;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Sum over ranks of a per-rank array field, or nullopt if the line lacks it.
std::optional<double> rank_sum(const nlohmann::json& line, const char* field) {
  if (!line.contains(field) || !line[field].is_array()) return std::nullopt;
  double sum = 0;
  for (const auto& value : line[field]) sum += value.get<double>();
  return sum;
}

// Reads one metrics JSONL file; UserError naming the file and line for anything unreadable.
RunMetrics read_metrics(const std::string& path) {
  std::istringstream in(read_text_file(path, "metrics file"));
  RunMetrics m;
  bool has_compute = true, has_sent = true, has_weights = true;
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.empty()) continue;
    try {
      const nlohmann::json line = nlohmann::json::parse(text);
      m.loss.push_back(line.at("loss").get<double>());
      m.bubble_ratio.push_back(line.at("bubble_ratio").get<double>());
      const auto compute = rank_sum(line, "compute_s");
      has_compute = has_compute && compute;
      if (compute) m.compute_s.push_back(*compute);
      const auto sent = rank_sum(line, "bytes_sent");
      has_sent = has_sent && sent;
      if (sent) m.bytes_sent.push_back(*sent);
      const auto& activations = line.at("peak_activation_bytes");
      for (const auto& bytes : activations) {
        m.peak_activation_bytes =
            std::max(m.peak_activation_bytes.value_or(0), bytes.get<double>());
      }
      const auto& optimizer = line.at("optimizer_state_bytes");
      if (line.contains("weight_bytes") && line["weight_bytes"].size() == optimizer.size()) {
        for (size_t r = 0; r < optimizer.size(); ++r) {
          const double bytes = line["weight_bytes"][r].get<double>() + optimizer[r].get<double>();
          m.weights_optimizer_bytes = std::max(m.weights_optimizer_bytes.value_or(0), bytes);
        }
      } else {
        has_weights = false;
      }
    } catch (const nlohmann::json::exception& e) {
      PPTRAIN_CHECK(false, "metrics file '", path, "' line ", number, ": ", e.what());
    }
  }
  PPTRAIN_CHECK(!m.loss.empty(), "metrics file '", path, "' has no step");
  if (!has_compute) m.compute_s.clear();
  if (!has_sent) m.bytes_sent.clear();
  if (!has_weights) m.weights_optimizer_bytes.reset();
  return m;
}

std::vector<std::string> train_command(const CompareArgs& args, int pp, const std::string& schedule,
                                       int dp, const std::string& metrics_path) {
  std::vector<std::string> argv = {args.pptrain,     "train",
                                   "--model",        args.model,
                                   "--layers",       std::to_string(args.layers),
                                   "--d-model",      std::to_string(args.d_model),
                                   "--heads",        std::to_string(args.heads),
                                   "--seq-len",      std::to_string(args.seq_len),
                                   "--data",         args.data,
                                   "--batch-size",   std::to_string(args.batch_size),
                                   "--microbatches", std::to_string(args.microbatches),
                                   "--steps",        std::to_string(args.steps),
                                   "--seed",         std::to_string(args.seed),
                                   "--pp",           std::to_string(pp),
                                   "--schedule",     schedule};
  if (dp > 1) argv.insert(argv.end(), {"--dp", std::to_string(dp)});
  argv.insert(argv.end(), {"--metrics", metrics_path, "--quiet"});
  return argv;
}

// Trains one configuration into OUT/runs/<name>.jsonl (.out, .err beside it).
RunOutcome train_run(const CompareArgs& args, const std::string& name, int pp,
                     const std::string& schedule, int dp) {
  const std::string base = (std::filesystem::path(args.out) / "runs" / name).string();
  const std::string metrics_path = base + ".jsonl";
  std::filesystem::remove(metrics_path);
  const ChildResult child =
      run_child(train_command(args, pp, schedule, dp, metrics_path), base + ".out", base + ".err");
  RunOutcome outcome;
  outcome.wall_s = child.wall_s;
  if (child.exit_code != 0) {
    outcome.status = RunOutcome::Status::kFailed;
    std::string line = first_line(read_text_file(base + ".err", "run's stderr file"));
    outcome.failure = line.empty() ? "exit status " + std::to_string(child.exit_code) : line;
    return outcome;
  }
  try {
    outcome.metrics = read_metrics(metrics_path);
    outcome.status = RunOutcome::Status::kOk;
  } catch (const UserError& e) {
    outcome.status = RunOutcome::Status::kFailed;
    outcome.failure = e.what();
  }
  return outcome;
}

// The schedules the training binary knows: its `schedule --list`; empty if it cannot say.
std::vector<std::string> binary_schedules(const CompareArgs& args) {
  const std::string base = (std::filesystem::path(args.out) / "runs" / "schedule-list").string();
  const ChildResult child =
      run_child({args.pptrain, "schedule", "--list"}, base + ".out", base + ".err");
  std::vector<std::string> names;
  if (child.exit_code != 0) return names;
  std::istringstream in(read_text_file(base + ".out", "schedule list"));
  std::string line;
  while (std::getline(in, line)) {
    // "| `name` | ... |"
    if (line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    if (end != std::string::npos) names.push_back(line.substr(3, end - 3));
  }
  return names;
}

bool in_registry(const std::string& schedule) {
  const std::vector<std::string> names = schedule_names();
  return std::find(names.begin(), names.end(), schedule) != names.end();
}

// --- simulation ---

// The approach's bubble ratio in the simulator: P ranks, M microbatches per step, F = I = W = 1;
// an asynchronous schedule over kSimulatedSteps steps with no flush (as `pptrain schedule`).
double simulated_bubble(const Approach& a, int pp, int microbatches) {
  const ScheduleEntry& entry = find_schedule(a.schedule);
  CostModel cost = CostModel::parse("F=1,I=1,W=1");
  cost.replicas = a.dp;
  const bool asynchronous = entry.update != WeightUpdate::kFlush;
  ScheduleOptions options;
  options.name = a.schedule;
  options.ranks = pp;
  options.microbatches = asynchronous ? kSimulatedSteps * microbatches : microbatches;
  options.costs = cost.stage_costs(pp * resolve_chunks(entry, 0), pp);
  Schedule schedule = make_schedule(options);
  if (schedule.replicated() && !has_grad_reductions(schedule)) {
    schedule = add_grad_reductions(schedule);
  }
  if (a.dp > 1 && !entry.averages_copies) schedule = add_grad_reductions(schedule);
  const VersionRule rule = version_rule_of(a.schedule, false, schedule.num_stages, microbatches);
  return simulate(validate(schedule), cost, rule, Record::kFigures).bubble_ratio;
}

// --- the table ---

bool same_losses(const std::vector<double>& run, const std::vector<double>& reference) {
  if (run.size() != reference.size()) return false;
  for (size_t i = 0; i < run.size(); ++i) {
    if (!(std::abs(run[i] - reference[i]) <= kSyncTolerance * std::abs(reference[i]))) {
      return false;
    }
  }
  return true;
}

void fill_measured(Row& row, const RunOutcome& reference, const RunOutcome* baseline, int loss_at) {
  if (row.run.status != RunOutcome::Status::kOk) return;
  const RunMetrics& m = row.run.metrics;
  row.measured_bubble = median(after_first(m.bubble_ratio));
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

// Where a measured "extra" column and the survey's mark disagree: > kExtraThreshold without a
// mark, <= 1 with one.
void check_mark(std::vector<Disagreement>& out, const Row& row, const char* column,
                std::optional<double> measured, bool marked) {
  if (!measured) return;
  char text[256];
  if (marked && *measured <= 1.0) {
    std::snprintf(text, sizeof text, "%s: survey marks extra %s, measured %.2fx DAPPLE's",
                  row.approach->name, column, *measured);
  } else if (!marked && *measured > kExtraThreshold) {
    std::snprintf(text, sizeof text, "%s: survey has no extra %s, measured %.2fx DAPPLE's",
                  row.approach->name, column, *measured);
  } else {
    return;
  }
  out.push_back({row.approach->name, column, text});
}

std::vector<Disagreement> disagreements(const std::vector<Row>& rows) {
  std::vector<Disagreement> out;
  for (const Row& row : rows) {
    const Approach& a = *row.approach;
    if (row.sync && *row.sync != a.survey_sync) {
      out.push_back({a.name, "schedule",
                     std::string(a.name) + ": survey says " + (a.survey_sync ? "Sync" : "Async") +
                         ", measured " + (*row.sync ? "sync" : "async") +
                         " (losses vs the --pp 1 run)"});
    }
    check_mark(out, row, "memory", row.memory_ratio, a.survey_extra_memory);
    check_mark(out, row, "compute", row.compute_ratio, a.survey_extra_compute);
    check_mark(out, row, "communication", row.comm_ratio, a.survey_extra_comm);
  }
  return out;
}

std::string status_text(const Row& row) {
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

// Markdown cells cannot hold '|' or a newline.
std::string cell(std::string text) {
  for (char& c : text) {
    if (c == '|') c = '/';
    if (c == '\n') c = ' ';
  }
  return text;
}

std::string config_text(const CompareArgs& args) {
  std::ostringstream out;
  out << "--model " << args.model << " --layers " << args.layers << " --d-model " << args.d_model
      << " --heads " << args.heads << " --seq-len " << args.seq_len << " --data " << args.data
      << " --batch-size " << args.batch_size << " --microbatches " << args.microbatches
      << " --steps " << args.steps << " --seed " << args.seed;
  return out.str();
}

std::string markdown(const CompareArgs& args, const std::vector<std::string>& command,
                     const RunOutcome& reference, const std::vector<Row>& rows,
                     const std::vector<Disagreement>& found) {
  std::vector<std::string> quoted;
  for (const std::string& word : command) quoted.push_back(shell_quote(word));
  std::ostringstream out;
  out << "# Pipeline approaches, measured\n\n";
  out << "Command:\n\n```\n" << join(quoted, " ") << "\n```\n\n";
  out << "Configuration: `" << config_text(args) << "`, each approach `pptrain train ... --pp "
      << args.pp << " --schedule S` (AvgPipe with `--dp 2`), trained by `" << args.pptrain
      << "`; reference `--pp 1 --schedule 1f1b`";
  if (reference.status == RunOutcome::Status::kOk) {
    out << " (final loss " << format(reference.metrics.loss.back(), "%.4f") << ", "
        << format(reference.wall_s, "%.1f") << " s)";
  } else {
    out << " (**failed: " << cell(reference.failure) << "**)";
  }
  out << ".\n\n";
  const bool has_baseline = std::any_of(rows.begin(), rows.end(), [](const Row& row) {
    return std::string(row.approach->schedule) == kBaselineSchedule &&
           row.run.status == RunOutcome::Status::kOk;
  });
  if (!has_baseline) {
    out << "**DAPPLE (`1f1b`) did not run here, so the memory, activation, compute and "
           "communication ratios are n/a.**\n\n";
  }
  out << "Ratios are to DAPPLE's run (`1f1b`, same pipeline) unless said. Schedule: sync when "
         "every step's loss equals the `--pp 1` run's to 1e-5 relative. Bubble: simulated "
         "(F = I = W = 1; asynchronous schedules over "
      << kSimulatedSteps
      << " steps without a flush) / measured (median of the steps after the first). Loss ratios "
         "are to the `--pp 1` run's. Memory: max over ranks of weight + optimizer-state bytes; "
         "activations: peak activation bytes, max over ranks. Compute and communication: mean "
         "over the steps after the first of the sum over ranks of compute_s and bytes_sent. In "
         "brackets: the "
         "survey's marks.\n\n";
  out << "| Approach | `--schedule` | Schedule [survey] | Bubble sim / measured | Final loss / "
         "pp1 | Loss@"
      << args.loss_at
      << " / pp1 | Convergence [survey] | Memory [survey] | Activations | Compute [survey] | "
         "Communication [survey] | Wall s |\n";
  out << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Row& row : rows) {
    const Approach& a = *row.approach;
    const auto survey = [](bool x) { return x ? " [X]" : " [ ]"; };
    out << "| " << a.name << " | `" << a.schedule << "`" << (a.dp > 1 ? " --dp 2" : "") << " | "
        << cell(status_text(row)) << " [" << (a.survey_sync ? "Sync" : "Async") << "] | "
        << format(row.simulated_bubble, "%.3f") << " / " << format(row.measured_bubble, "%.3f")
        << " | " << format(row.final_loss_ratio, "%.3f") << " | "
        << format(row.loss_at_ratio, "%.3f") << " | [" << a.survey_convergence << "] | "
        << format(row.memory_ratio) << survey(a.survey_extra_memory) << " | "
        << format(row.activation_ratio) << " | " << format(row.compute_ratio)
        << survey(a.survey_extra_compute) << " | " << format(row.comm_ratio)
        << survey(a.survey_extra_comm) << " | "
        << (row.run.status == RunOutcome::Status::kNotBuilt ? "" : format(row.run.wall_s, "%.1f"))
        << " |\n";
  }
  out << "\n## Disagrees with the survey\n\n";
  out << "An extra column disagrees when the measured ratio is above " << kExtraThreshold
      << " without the survey's X, or at most 1.00 with it; the schedule when the measured "
         "sync/async differs from the survey's.\n\n";
  if (found.empty()) out << "Nothing measured disagrees.\n";
  for (const Disagreement& d : found) out << "- " << d.text << "\n";
  return out.str();
}

nlohmann::ordered_json json_report(const CompareArgs& args, const std::vector<std::string>& command,
                                   const RunOutcome& reference, const std::vector<Row>& rows,
                                   const std::vector<Disagreement>& found) {
  nlohmann::ordered_json out;
  out["command"] = command;
  nlohmann::ordered_json& config = out["config"];
  config["model"] = args.model;
  config["layers"] = args.layers;
  config["d_model"] = args.d_model;
  config["heads"] = args.heads;
  config["seq_len"] = args.seq_len;
  config["data"] = args.data;
  config["pp"] = args.pp;
  config["batch_size"] = args.batch_size;
  config["microbatches"] = args.microbatches;
  config["steps"] = args.steps;
  config["seed"] = args.seed;
  config["loss_at"] = args.loss_at;
  config["pptrain"] = args.pptrain;
  config["simulated_steps_async"] = kSimulatedSteps;
  nlohmann::ordered_json& ref = out["reference"];
  ref["status"] = reference.status == RunOutcome::Status::kOk ? "ok" : "failed";
  ref["failure"] = reference.failure;
  ref["wall_s"] = reference.wall_s;
  ref["final_loss"] = reference.status == RunOutcome::Status::kOk
                          ? nlohmann::ordered_json(reference.metrics.loss.back())
                          : nlohmann::ordered_json(nullptr);
  out["approaches"] = nlohmann::ordered_json::array();
  for (const Row& row : rows) {
    const Approach& a = *row.approach;
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
  for (const Disagreement& d : found) {
    out["disagreements"].push_back(
        {{"approach", d.approach}, {"column", d.column}, {"text", d.text}});
  }
  return out;
}

// --- the loss plot ---

// Ticks at 1, 2 or 5 x 10^k (at least `min_step` apart) covering [low, high], about `count`
// of them.
std::vector<double> nice_ticks(double low, double high, int count, double min_step = 0) {
  const double span = std::max(high - low, 1e-12);
  const double raw = std::max(span / count, min_step);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    step = factor * power;
    if (step >= raw * (1 - 1e-9)) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(low / step - 1e-9) * step; t <= high + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// A tick's label with as many decimals as the ticks' spacing needs.
std::string tick_label(double value, const std::vector<double>& ticks) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

struct Curve {
  std::string label;
  const std::vector<double>* loss;
  std::string colour;
  bool dashed;
};

std::string loss_svg(const std::vector<Curve>& curves, int steps) {
  constexpr double kWidth = 960, kHeight = 540;
  constexpr double kLeft = 70, kRight = 720, kTop = 40, kBottom = 480;  // the plot area, px
  double low = 0, high = 1;
  bool first = true;
  for (const Curve& c : curves) {
    for (double v : *c.loss) {
      if (!std::isfinite(v)) continue;
      low = first ? v : std::min(low, v);
      high = first ? v : std::max(high, v);
      first = false;
    }
  }
  if (high - low < 1e-9) {
    low -= 0.5;
    high += 0.5;
  }
  // The axis runs from a tick below the lowest loss to a tick above the highest.
  std::vector<double> y_ticks = nice_ticks(low, high, 6);
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : high - low;
  if (y_ticks.empty() || y_ticks.front() > low + 1e-9 * y_step) {
    y_ticks.insert(y_ticks.begin(), (y_ticks.empty() ? high : y_ticks.front()) - y_step);
  }
  if (y_ticks.back() < high - 1e-9 * y_step) y_ticks.push_back(y_ticks.back() + y_step);
  low = y_ticks.front();
  high = y_ticks.back();
  const double x_max = std::max(steps, 2);
  const auto x = [&](double step) { return kLeft + (step - 1) / (x_max - 1) * (kRight - kLeft); };
  const auto y = [&](double loss) {
    return kBottom - (loss - low) / (high - low) * (kBottom - kTop);
  };
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << (kLeft + kRight) / 2
      << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">Training loss per step</text>\n";
  // Axes, ticks and grid lines.
  out << "<line x1=\"" << kLeft << "\" y1=\"" << kBottom << "\" x2=\"" << kRight << "\" y2=\""
      << kBottom << "\" stroke=\"black\"/>\n";
  out << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\""
      << kBottom << "\" stroke=\"black\"/>\n";
  for (double t : y_ticks) {
    out << "<line x1=\"" << kLeft - 5 << "\" y1=\"" << y(t) << "\" x2=\"" << kRight << "\" y2=\""
        << y(t) << "\" stroke=\"#ddd\"/>\n";
    out << "<text x=\"" << kLeft - 8 << "\" y=\"" << y(t) + 4 << "\" text-anchor=\"end\">"
        << tick_label(t, y_ticks) << "</text>\n";
  }
  for (double t : nice_ticks(1, x_max, 8, /*min_step=*/1)) {
    if (t < 1) continue;
    out << "<line x1=\"" << x(t) << "\" y1=\"" << kBottom << "\" x2=\"" << x(t) << "\" y2=\""
        << kBottom + 5 << "\" stroke=\"black\"/>\n";
    out << "<text x=\"" << x(t) << "\" y=\"" << kBottom + 18 << "\" text-anchor=\"middle\">"
        << static_cast<long long>(t) << "</text>\n";
  }
  out << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kBottom + 40
      << "\" text-anchor=\"middle\">step</text>\n";
  out << "<text x=\"18\" y=\"" << (kTop + kBottom) / 2 << "\" text-anchor=\"middle\" "
      << "transform=\"rotate(-90 18 " << (kTop + kBottom) / 2 << ")\">loss</text>\n";
  // One polyline and one legend entry per run.
  for (size_t i = 0; i < curves.size(); ++i) {
    const Curve& c = curves[i];
    out << "<polyline fill=\"none\" stroke=\"" << c.colour << "\" stroke-width=\"1.5\""
        << (c.dashed ? " stroke-dasharray=\"6 3\"" : "") << " points=\"";
    for (size_t s = 0; s < c.loss->size(); ++s) {
      const double v = (*c.loss)[s];
      if (std::isfinite(v)) out << x(static_cast<double>(s + 1)) << "," << y(v) << " ";
    }
    out << "\"/>\n";
    const double legend_y = kTop + 10 + 20 * static_cast<double>(i);
    out << "<line x1=\"" << kRight + 20 << "\" y1=\"" << legend_y << "\" x2=\"" << kRight + 50
        << "\" y2=\"" << legend_y << "\" stroke=\"" << c.colour << "\" stroke-width=\"2\""
        << (c.dashed ? " stroke-dasharray=\"6 3\"" : "") << "/>\n";
    out << "<text x=\"" << kRight + 58 << "\" y=\"" << legend_y + 4 << "\">" << svg_escape(c.label)
        << "</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                                    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"};

// --- the command ---

void run_compare_command(CompareArgs args) {
  check_args(args);
  const std::vector<std::string> command = own_command_line();
  const std::vector<const Approach*> selected = selected_approaches(args.only);

  // An approach is built when the training binary lists it; if it cannot list, when this
  // program's registry has it.
  std::vector<std::string> known = binary_schedules(args);
  if (known.empty()) known = schedule_names();
  const auto built = [&](const Approach& a) {
    return std::find(known.begin(), known.end(), a.schedule) != known.end();
  };

  const int total = static_cast<int>(selected.size()) + 1;
  int index = 0;
  const auto progress = [&](const std::string& what, const RunOutcome& run) {
    ++index;
    if (run.status == RunOutcome::Status::kNotBuilt) {
      std::printf("compare: [%d/%d] %s: not built in %s\n", index, total, what.c_str(),
                  args.pptrain.c_str());
    } else if (run.status == RunOutcome::Status::kFailed) {
      std::printf("compare: [%d/%d] %s: failed after %.1f s: %s\n", index, total, what.c_str(),
                  run.wall_s, run.failure.c_str());
    } else {
      std::printf("compare: [%d/%d] %s: %.1f s, final loss %.4f\n", index, total, what.c_str(),
                  run.wall_s, run.metrics.loss.back());
    }
    std::fflush(stdout);
  };

  const RunOutcome reference = train_run(args, kReferenceName, 1, "1f1b", 1);
  progress("reference (--pp 1 --schedule 1f1b)", reference);

  std::vector<Row> rows;
  for (const Approach* a : selected) {
    Row row;
    row.approach = a;
    if (in_registry(a->schedule)) {
      try {
        row.simulated_bubble = simulated_bubble(*a, args.pp, args.microbatches);
      } catch (const UserError& e) {
        row.simulation_error = e.what();
      }
    } else {
      row.simulation_error = "not in this program's schedule registry";
    }
    if (built(*a)) {
      row.run = train_run(args, a->schedule, args.pp, a->schedule, a->dp);
    } else {
      row.run.status = RunOutcome::Status::kNotBuilt;
    }
    progress(std::string(a->name) + " (" + a->schedule + ")", row.run);
    rows.push_back(std::move(row));
  }

  const RunOutcome* baseline = nullptr;
  for (const Row& row : rows) {
    if (std::string(row.approach->schedule) == kBaselineSchedule) baseline = &row.run;
  }
  for (Row& row : rows) fill_measured(row, reference, baseline, args.loss_at);
  const std::vector<Disagreement> found = disagreements(rows);

  const std::filesystem::path out(args.out);
  write_text_file((out / "compare.md").string(), markdown(args, command, reference, rows, found),
                  "--out file");
  write_text_file((out / "compare.json").string(),
                  json_report(args, command, reference, rows, found).dump(2) + "\n", "--out file");
  std::vector<Curve> curves;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].run.status != RunOutcome::Status::kOk) continue;
    curves.push_back({rows[i].approach->name, &rows[i].run.metrics.loss,
                      kColours[i % std::size(kColours)], false});
  }
  // Last, dashed: a synchronous run's line lies under it and still shows.
  if (reference.status == RunOutcome::Status::kOk) {
    curves.push_back({"reference (--pp 1)", &reference.metrics.loss, "black", true});
  }
  write_text_file((out / "losses.svg").string(), loss_svg(curves, args.steps), "--out file");
  std::printf("compare: wrote %s, %s, %s\n", (out / "compare.md").c_str(),
              (out / "compare.json").c_str(), (out / "losses.svg").c_str());
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Train one configuration with each approach of the survey and write its table, measured");
  CompareArgs& a = *args;
  cmd->add_option("--out", a.out,
                  "Folder for compare.md, compare.json, losses.svg and runs/<schedule>.jsonl")
      ->required();
  auto* only = cmd->add_option("--only", a.only,
                               "Comma list of approaches to run (survey names or schedules, e.g. "
                               "1f1b,pipedream); default: all 14");
  cmd->add_option("--pptrain", a.pptrain,
                  "The pptrain binary that trains (with its pptrain-runtime); default: this one");
  cmd->add_option("--model", a.model, "Model: gpt or mlp")->capture_default_str();
  cmd->add_option("--layers", a.layers, "Blocks (Megatron-LM needs a multiple of 2 x --pp)")
      ->capture_default_str();
  cmd->add_option("--d-model", a.d_model, "Model width")->capture_default_str();
  cmd->add_option("--heads", a.heads, "Attention heads (gpt)")->capture_default_str();
  cmd->add_option("--seq-len", a.seq_len, "Tokens per sample (gpt)")->capture_default_str();
  cmd->add_option("--data", a.data, "As pptrain train --data")->capture_default_str();
  cmd->add_option("--pp", a.pp, "Pipeline ranks of every approach")->capture_default_str();
  cmd->add_option("--batch-size", a.batch_size, "Samples per step (AvgPipe: over its 2 copies)")
      ->capture_default_str();
  cmd->add_option("--microbatches", a.microbatches, "Microbatches per step (M)")
      ->capture_default_str();
  cmd->add_option("--steps", a.steps, "Optimizer steps of every run")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Seed of the weights and the data")->capture_default_str();
  cmd->add_option("--loss-at", a.loss_at,
                  "Step of the second convergence column; default: --steps / 2");
  cmd->callback([args, only] {
    args->only_given = only->count() > 0;
    run_compare_command(*args);
  });
}

}  // namespace pptrain::cli
