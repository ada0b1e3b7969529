#include "pptrain/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/memory.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"
#include "pptrain/runtime/executor.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/schedule/generators.h"
#include "pptrain/schedule/validate.h"
#include "pptrain/sim/compare.h"
#include "pptrain/sim/metrics.h"
#include "pptrain/train/partition_plan.h"

namespace pptrain {

namespace {

using Clock = std::chrono::steady_clock;

// Control-message tags (pipeline messages use tags below kControlTagBase).
constexpr int kReportHeaderTag = kControlTagBase + 1;
constexpr int kReportEventsTag = kControlTagBase + 2;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// The --pp 1 reference: one stage, all forwards, then all backwards (GPipe on one rank).
Schedule single_stage_schedule(const std::string& name, int microbatches) {
  Schedule s;
  s.name = name;
  s.num_ranks = 1;
  s.num_stages = 1;
  s.num_microbatches = microbatches;
  s.stage_to_rank = {0};
  s.actions.resize(1);
  for (int m = 0; m < microbatches; ++m) s.actions[0].push_back(Action::make(Op::F, 0, m));
  for (int m = 0; m < microbatches; ++m) s.actions[0].push_back(Action::make(Op::B, 0, m));
  return s;
}

void check_output_path(const std::string& path, const char* flag) {
  if (path.empty()) return;
  const auto parent = std::filesystem::path(path).parent_path();
  PPTRAIN_CHECK(parent.empty() || std::filesystem::is_directory(parent), flag, " '", path,
                "': folder '", parent.string(), "' does not exist");
}

// Global gradient norm over every stage's parameters (one all-reduce of the squared norm, summed
// in float64), then scaling to max_norm as torch.nn.utils.clip_grad_norm_ does. Returns the norm
// before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      Transport& transport) {
  torch::NoGradGuard no_grad;
  auto squared = torch::zeros({1}, torch::kFloat64);
  for (const auto& p : params) {
    if (p.grad().defined()) squared += p.grad().to(torch::kFloat64).pow(2).sum();
  }
  transport.allreduce_sum(squared);
  const double norm = std::sqrt(squared.item<double>());
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1) {
      for (const auto& p : params) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  return norm;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& options,
                                                        const std::vector<torch::Tensor>& params) {
  if (options.optimizer == "adamw") {
    const double lr = options.lr > 0 ? options.lr : 1e-3;
    return std::make_unique<torch::optim::AdamW>(params,
                                                 torch::optim::AdamWOptions(lr).weight_decay(0.01));
  }
  const double lr = options.lr > 0 ? options.lr : 0.05;
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
}

// One rank's share of a step, as rank 0 collects it.
struct RankReport {
  bool has_loss = false;
  double loss = 0;
  int64_t peak_activation_bytes = 0;
  double step_seconds = 0;
  double start_s = 0;  // the step's start on the host's steady clock: aligns the ranks' events
  std::vector<TimelineEvent> events;
};

// Every rank sends its report to rank 0 (float64 messages: a header, then [n, 5] events of op,
// stage, microbatch, start, end); rank 0 returns all of them, the others an empty list.
std::vector<RankReport> gather_reports(const RankReport& mine, Transport& transport) {
  const int rank = transport.rank();
  auto header = torch::tensor(
      {mine.has_loss ? 1.0 : 0.0, mine.loss, static_cast<double>(mine.peak_activation_bytes),
       mine.step_seconds, static_cast<double>(mine.events.size()), mine.start_s},
      torch::kFloat64);
  if (rank != 0) {
    auto events = torch::empty({static_cast<int64_t>(mine.events.size()), 5}, torch::kFloat64);
    auto e = events.accessor<double, 2>();
    for (size_t i = 0; i < mine.events.size(); ++i) {
      const auto& ev = mine.events[i];
      e[i][0] = static_cast<double>(ev.action.op);
      e[i][1] = ev.action.stage;
      e[i][2] = ev.action.microbatch;
      e[i][3] = ev.start;
      e[i][4] = ev.end;
    }
    auto sent_header = transport.send(header, 0, kReportHeaderTag);
    auto sent_events = transport.send(events, 0, kReportEventsTag);
    sent_header.wait();
    sent_events.wait();
    return {};
  }
  std::vector<RankReport> reports(transport.world_size());
  reports[0] = mine;
  for (int peer = 1; peer < transport.world_size(); ++peer) {
    auto h = torch::empty({6}, torch::kFloat64);
    transport.recv(h, peer, kReportHeaderTag).wait();
    RankReport& r = reports[peer];
    r.has_loss = h[0].item<double>() != 0;
    r.loss = h[1].item<double>();
    r.peak_activation_bytes = static_cast<int64_t>(h[2].item<double>());
    r.step_seconds = h[3].item<double>();
    r.start_s = h[5].item<double>();
    auto events = torch::empty({static_cast<int64_t>(h[4].item<double>()), 5}, torch::kFloat64);
    transport.recv(events, peer, kReportEventsTag).wait();
    auto e = events.accessor<double, 2>();
    for (int64_t i = 0; i < events.size(0); ++i) {
      const Action action = Action::make(static_cast<Op>(static_cast<int>(e[i][0])),
                                         static_cast<int>(e[i][1]), static_cast<int>(e[i][2]));
      r.events.push_back({peer, action, e[i][3], e[i][4]});
    }
  }
  return reports;
}

// A test hook: PPTRAIN_TEST_CRASH_RANK=r PPTRAIN_TEST_CRASH_STEP=k makes rank r abort at the start
// of step k (0-based), to check that the launcher stops the whole run.
void maybe_crash_for_test(int rank, int step) {
  const char* crash_rank = std::getenv("PPTRAIN_TEST_CRASH_RANK");
  const char* crash_step = std::getenv("PPTRAIN_TEST_CRASH_STEP");
  if (crash_rank && crash_step && std::atoi(crash_rank) == rank && std::atoi(crash_step) == step) {
    std::abort();
  }
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

ValidatedSchedule plan_training(const TrainOptions& options) {
  check_options(options.model);
  const int M = options.data.microbatches;
  PPTRAIN_CHECK(options.pp >= 1, "--pp must be >= 1, got ", options.pp);
  PPTRAIN_CHECK(M >= 1, "--microbatches must be >= 1, got ", M);
  PPTRAIN_CHECK(options.data.batch_size >= 1 && options.data.batch_size % M == 0, "--batch-size ",
                options.data.batch_size, " is not a positive multiple of --microbatches ", M);
  PPTRAIN_CHECK(options.steps >= 1, "--steps must be >= 1, got ", options.steps);
  PPTRAIN_CHECK(options.chunks >= 0, "--chunks must be >= 1, got ", options.chunks);
  PPTRAIN_CHECK(options.optimizer == "sgd" || options.optimizer == "adamw",
                "--optimizer must be sgd or adamw, got '", options.optimizer, "'");
  PPTRAIN_CHECK(options.lr >= 0 && std::isfinite(options.lr), "--lr must be >= 0, got ",
                options.lr);
  PPTRAIN_CHECK(options.clip >= 0 && std::isfinite(options.clip), "--clip must be >= 0, got ",
                options.clip);
  PPTRAIN_CHECK(options.threads >= 1, "--threads must be >= 1, got ", options.threads);
  const int blocks = num_blocks(options.model);
  PPTRAIN_CHECK(options.pp <= blocks, "--pp ", options.pp, " is larger than the model's ", blocks,
                " blocks (--layers ", options.model.layers,
                "); every stage needs at least one block");

  Schedule schedule;
  std::string what;  // how errors name the schedule
  if (!options.schedule_file.empty()) {
    what = "schedule file '" + options.schedule_file + "'";
    schedule = read_schedule_csv(options.schedule_file);
    PPTRAIN_CHECK(schedule.num_ranks == options.pp, what, " is for ", schedule.num_ranks,
                  " ranks, but --pp is ", options.pp);
    PPTRAIN_CHECK(schedule.num_microbatches == M, what, " has ", schedule.num_microbatches,
                  " microbatches, but --microbatches is ", M);
    PPTRAIN_CHECK(options.chunks == 0 || options.chunks == schedule.chunks(), "--chunks ",
                  options.chunks, " does not match ", what, ", which has ", schedule.chunks(),
                  " stages per rank");
  } else {
    what = "schedule '" + options.schedule + "'";
    const auto& names = schedule_names();
    PPTRAIN_CHECK(std::find(names.begin(), names.end(), options.schedule) != names.end(),
                  "unknown schedule '", options.schedule, "' (expected one of: ", join(names), ")");
    // One rank has nothing to overlap: every schedule is the same single-stage run.
    schedule = options.pp == 1 ? single_stage_schedule(options.schedule, M)
                               : make_schedule({options.schedule, options.pp, M, options.chunks});
  }
  PPTRAIN_CHECK(schedule.flushes, what,
                " is asynchronous (no flush); the runtime runs synchronous schedules only for now");
  PPTRAIN_CHECK(schedule.num_stages <= blocks, what, " has ", schedule.num_stages, " stages (--pp ",
                options.pp, " x ", schedule.chunks(), " chunks) but the model has only ", blocks,
                " blocks (--layers ", options.model.layers, ")");
  std::optional<ValidatedSchedule> validated;
  try {
    validated = validate(schedule);
  } catch (const ScheduleError& e) {
    std::string where;
    if (e.rank() >= 0) where = "rank " + std::to_string(e.rank()) + ", ";
    if (e.rank() >= 0 && e.position() >= 0 && e.rank() < schedule.num_ranks &&
        e.position() < static_cast<int>(schedule.actions[e.rank()].size())) {
      where += "position " + std::to_string(e.position()) + " (" +
               to_string(schedule.actions[e.rank()][e.position()]) + "), ";
    }
    throw UserError(what + " is not valid: " + where + e.message() +
                    " (see `pptrain schedule` for the grid)");
  }
  // Reads (and so checks) the data source on every process before any worker starts.
  DataOptions data = options.data;
  Dataset check_data(options.model, data);
  check_output_path(options.metrics_path, "--metrics");
  check_output_path(options.trace_path, "--trace file");
  check_output_path(options.svg_path, "--svg file");
  if (!options.load_dir.empty()) {
    PPTRAIN_CHECK(std::filesystem::is_directory(options.load_dir), "--load '", options.load_dir,
                  "' is not a folder");
  }
  return *validated;
}

void train(const TrainOptions& options, const ValidatedSchedule& validated, Transport& transport) {
  const Schedule& lowered = *validated;
  install_counting_allocator();
  set_compute_threads(options.threads);
  const int rank = transport.rank();
  const int P = transport.world_size();
  PPTRAIN_CHECK(P == lowered.num_ranks, "WORLD_SIZE=", P, " but the schedule is for --pp ",
                lowered.num_ranks);
  const int M = lowered.num_microbatches;
  const int S = lowered.num_stages;
  const int64_t microbatch_size = options.data.batch_size / M;

  // This rank's stages, from the same per-layer seeds as any other split.
  const auto ranges = plan_stage_layers(options, S, /*may_profile=*/false);
  std::vector<Stage> stages;
  for (int s : lowered.stages_of(rank)) stages.push_back(make_stage(options.model, s, ranges[s]));
  std::vector<Stage*> stage_ptrs;
  std::vector<torch::Tensor> params;
  for (auto& stage : stages) {
    if (!options.load_dir.empty()) stage.load(options.load_dir);
    stage_ptrs.push_back(&stage);
    for (const auto& p : stage.parameters()) params.push_back(p);
  }
  // Gradients live from the start and are zeroed in place, so a step's memory peak counts only
  // what the step itself allocates.
  for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
  auto optimizer = make_optimizer(options, params);

  std::vector<std::vector<int64_t>> boundary_shapes;
  for (int b = 0; b + 1 < S; ++b) {
    boundary_shapes.push_back(layer_output_shape(options.model, ranges[b].second, microbatch_size));
  }
  const ModelOptions model = options.model;
  ExecutorOptions executor_options;
  executor_options.rank = rank;
  executor_options.stages = stage_ptrs;
  executor_options.transport = &transport;
  executor_options.loss = [model](const torch::Tensor& output, const torch::Tensor& target) {
    return compute_loss(model, output, target);
  };
  executor_options.boundary_shapes = boundary_shapes;
  executor_options.recompute = options.recompute;
  Executor executor(validated, executor_options);

  const bool first = lowered.stage_to_rank[0] == rank;
  const bool last = lowered.stage_to_rank[S - 1] == rank;
  std::optional<Dataset> dataset;
  if (first || last) dataset.emplace(options.model, options.data);

  std::ofstream metrics;
  if (rank == 0 && !options.metrics_path.empty()) {
    metrics.open(options.metrics_path);
    PPTRAIN_CHECK(metrics.good(), "cannot write --metrics file '", options.metrics_path, "'");
  }
  const double tokens_per_sample = options.model.kind == "gpt" ? options.model.seq_len : 1;
  if (rank == 0 && !options.quiet) {
    std::printf(
        "training %s (%d layers, d_model %d) with %s: %d rank%s, %d stage%s, %d microbatches of "
        "%lld\n",
        options.model.kind.c_str(), num_layers(options.model), options.model.d_model,
        lowered.name.c_str(), P, P == 1 ? "" : "s", S, S == 1 ? "" : "s", M,
        static_cast<long long>(microbatch_size));
    std::printf("%s\n", describe_stage_layers(options.model, options.partition, ranges).c_str());
    std::fflush(stdout);
  }

  std::vector<Timeline> measured_steps;  // rank 0, --compare-sim
  for (int step = 0; step < options.steps; ++step) {
    maybe_crash_for_test(rank, step);
    StepData data;
    if (dataset) {
      const auto batch = dataset->batch(step);
      if (first) data.inputs = Dataset::split(batch.inputs, M);
      if (last) data.targets = Dataset::split(batch.targets, M);
    }
    for (auto& p : params) p.mutable_grad().zero_();

    transport.barrier();  // a common start, so the ranks' timelines line up
    const auto start = Clock::now();
    const int64_t base_bytes = allocated_bytes();
    reset_peak();
    StepRecord record = executor.run_step(data, start);
    RankReport mine;
    mine.peak_activation_bytes = peak_bytes() - base_bytes;
    const double grad_norm = clip_grad_norm(params, options.clip, transport);
    optimizer->step();
    mine.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    mine.start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
    mine.has_loss = record.has_loss;
    mine.loss = record.loss;
    mine.events = std::move(record.events);

    const auto reports = gather_reports(mine, transport);
    if (rank != 0) continue;
    Timeline timeline;
    timeline.unit = TimeUnit::kSeconds;
    timeline.title = lowered.name + ", P=" + std::to_string(P) + ", M=" + std::to_string(M) +
                     " (measured, step " + std::to_string(step + 1) + ")";
    timeline.num_ranks = P;
    double loss = 0, step_seconds = 0;
    std::vector<int64_t> peaks;
    for (const auto& r : reports) {
      if (r.has_loss) loss = r.loss;
      step_seconds = std::max(step_seconds, r.step_seconds);
      peaks.push_back(r.peak_activation_bytes);
      // Each rank timed its events from its own start after the barrier; on rank 0's clock they
      // begin (start_s - rank 0's start_s) later. Worker processes of one host share the steady
      // clock; a gap of a second or more means they do not (other hosts), and the ranks'
      // starts are taken as simultaneous instead.
      double offset = r.start_s - reports[0].start_s;
      if (std::abs(offset) >= 1.0) offset = 0;
      for (TimelineEvent e : r.events) {
        e.start += offset;
        e.end += offset;
        timeline.events.push_back(e);
      }
    }
    const TimelineStats stats = timeline_stats(timeline);
    char bubble_text[32];
    std::snprintf(bubble_text, sizeof(bubble_text), ", bubble %.1f%%", 100 * stats.bubble_ratio);
    timeline.title += bubble_text;
    const double samples_per_s = options.data.batch_size / step_seconds;
    const double tokens_per_s = samples_per_s * tokens_per_sample;
    if (!options.quiet) {
      std::string peak_text;
      for (auto b : peaks) peak_text += (peak_text.empty() ? "" : "/") + mib(b);
      std::printf(
          "step %d/%d  loss %.6f  time %.4f s  %.0f tokens/s  bubble %.3f  peak act %s MiB\n",
          step + 1, options.steps, loss, step_seconds, tokens_per_s, stats.bubble_ratio,
          peak_text.c_str());
      std::fflush(stdout);
    }
    // --compare-sim reads the costs off every step but the first (a warm-up: first-touch
    // allocations, cold caches), or off the only one.
    if (options.compare_sim && (step > 0 || options.steps == 1)) measured_steps.push_back(timeline);
    std::optional<Comparison> comparison;
    if (options.compare_sim && step + 1 == options.steps) {
      comparison = compare_to_simulation(validated, measured_steps);
      std::printf("%s", format_comparison(*comparison).c_str());
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      nlohmann::ordered_json line = {{"step", step + 1},
                                     {"loss", loss},
                                     {"step_time_s", step_seconds},
                                     {"samples_per_s", samples_per_s},
                                     {"tokens_per_s", tokens_per_s},
                                     {"bubble_ratio", stats.bubble_ratio},
                                     {"grad_norm", grad_norm},
                                     {"peak_activation_bytes", peaks}};
      if (comparison) line["compare_sim"] = comparison_json(*comparison);
      metrics << line.dump() << "\n";
      metrics.flush();
    }
    if (step + 1 == options.steps) {
      if (!options.trace_path.empty()) {
        write_text_file(options.trace_path, render_chrome_trace(timeline), "--trace file");
      }
      if (!options.svg_path.empty()) {
        SvgOptions svg;
        svg.time_unit = "s";
        svg.show_comms = true;
        if (comparison) {
          // Measured above predicted, on one time axis.
          svg.title = lowered.name + ", P=" + std::to_string(P) + ", M=" + std::to_string(M) +
                      ": measured step " + std::to_string(step + 1) +
                      " above its prediction from the run's own costs";
          svg.labels = {"measured", "predicted"};
          write_text_file(options.svg_path,
                          render_svg({timeline, comparison->predicted.timeline}, svg),
                          "--svg file");
        } else {
          write_text_file(options.svg_path, render_svg(timeline, svg), "--svg file");
        }
      }
    }
  }

  if (!options.save_dir.empty()) {
    for (const auto& stage : stages) stage.save(options.save_dir);
    transport.barrier();  // every layer is on disk before rank 0 says so
    if (rank == 0 && !options.quiet) {
      std::printf("saved parameters to %s (one file per layer)\n", options.save_dir.c_str());
    }
  }
  transport.barrier();
}

}  // namespace pptrain
