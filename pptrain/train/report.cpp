#include "pptrain/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "pptrain/device/kernels.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/workers.h"
#include "pptrain/train/control_tags.h"

namespace pptrain {
namespace {

// has_loss, loss, peak bytes, seconds, event count, start_s, grad_norm_squared, weight_versions,
// optimizer state bytes, bytes sent, weight bytes, compute CPU seconds, rollbacks, checkpoint
// stall seconds, resident bytes, peak memory bytes, predicted peak memory bytes and its parts
// (weights, gradients, optimizer, data, activations, messages, transient, whether the state
// came after the backwards)
constexpr int kHeaderFields = 26;
constexpr int kEventFields = 5;  // op, stage, microbatch, start, end

// Every rank sends its measurements to rank 0 as float64 messages (a header, then [n, 5]
// events); rank 0 returns all of them in rank order, the others an empty list.
std::vector<RankStep> gather(const RankStep& mine, Transport& transport,
                             std::vector<PendingComm>* unsent) {
  const int rank = transport.rank();
  auto header = torch::tensor({mine.has_loss ? 1.0 : 0.0,
                               mine.loss,
                               static_cast<double>(mine.peak_activation_bytes),
                               mine.seconds,
                               static_cast<double>(mine.events.size()),
                               mine.start_s,
                               mine.grad_norm_squared,
                               static_cast<double>(mine.weight_versions),
                               static_cast<double>(mine.optimizer_state_bytes),
                               static_cast<double>(mine.bytes_sent),
                               static_cast<double>(mine.weight_bytes),
                               mine.compute_s,
                               static_cast<double>(mine.rollbacks),
                               mine.checkpoint_stall_s,
                               static_cast<double>(mine.resident_bytes),
                               static_cast<double>(mine.peak_memory_bytes),
                               static_cast<double>(mine.predicted_peak_memory_bytes),
                               mine.predicted_memory.weights,
                               mine.predicted_memory.gradients,
                               mine.predicted_memory.optimizer,
                               mine.predicted_memory.data,
                               mine.predicted_memory.activations,
                               mine.predicted_memory.messages,
                               mine.predicted_memory.transient,
                               mine.predicted_memory.fresh_state ? 1.0 : 0.0,
                               mine.predicted_memory.casts},
                              torch::kFloat64);
  if (rank != 0) {
    auto events =
        torch::empty({static_cast<int64_t>(mine.events.size()), kEventFields}, torch::kFloat64);
    auto e = events.accessor<double, 2>();
    for (size_t i = 0; i < mine.events.size(); ++i) {
      const auto& ev = mine.events[i];
      e[i][0] = static_cast<double>(ev.action.op);
      e[i][1] = ev.action.stage;
      e[i][2] = ev.action.microbatch;
      e[i][3] = ev.start;
      e[i][4] = ev.end;
    }
    auto sent_header = transport.send(header, 0, tag_of(ControlTag::kReportHeader));
    auto sent_events = transport.send(events, 0, tag_of(ControlTag::kReportEvents));
    if (unsent) {
      unsent->push_back(std::move(sent_header));
      unsent->push_back(std::move(sent_events));
    } else {
      sent_header.wait();
      sent_events.wait();
    }
    return {};
  }
  std::vector<RankStep> steps(transport.world_size());
  steps[0] = mine;
  for (int peer = 1; peer < transport.world_size(); ++peer) {
    auto h = torch::empty({kHeaderFields}, torch::kFloat64);
    transport.recv(h, peer, tag_of(ControlTag::kReportHeader)).wait();
    RankStep& r = steps[peer];
    r.has_loss = h[0].item<double>() != 0;
    r.loss = h[1].item<double>();
    r.peak_activation_bytes = static_cast<int64_t>(h[2].item<double>());
    r.seconds = h[3].item<double>();
    r.start_s = h[5].item<double>();
    r.grad_norm_squared = h[6].item<double>();
    r.weight_versions = static_cast<int>(h[7].item<double>());
    r.optimizer_state_bytes = static_cast<int64_t>(h[8].item<double>());
    r.bytes_sent = static_cast<int64_t>(h[9].item<double>());
    r.weight_bytes = static_cast<int64_t>(h[10].item<double>());
    r.compute_s = h[11].item<double>();
    r.rollbacks = static_cast<int>(h[12].item<double>());
    r.checkpoint_stall_s = h[13].item<double>();
    r.resident_bytes = static_cast<int64_t>(h[14].item<double>());
    r.peak_memory_bytes = static_cast<int64_t>(h[15].item<double>());
    r.predicted_peak_memory_bytes = static_cast<int64_t>(h[16].item<double>());
    RankMemory& m = r.predicted_memory;
    m.weights = h[17].item<double>();
    m.gradients = h[18].item<double>();
    m.optimizer = h[19].item<double>();
    m.data = h[20].item<double>();
    m.activations = h[21].item<double>();
    m.messages = h[22].item<double>();
    m.transient = h[23].item<double>();
    m.fresh_state = h[24].item<double>() != 0;
    m.casts = h[25].item<double>();
    auto events =
        torch::empty({static_cast<int64_t>(h[4].item<double>()), kEventFields}, torch::kFloat64);
    transport.recv(events, peer, tag_of(ControlTag::kReportEvents)).wait();
    auto e = events.accessor<double, 2>();
    for (int64_t i = 0; i < events.size(0); ++i) {
      const Action action = Action::make(static_cast<Op>(static_cast<int>(e[i][0])),
                                         static_cast<int>(e[i][1]), static_cast<int>(e[i][2]));
      r.events.push_back({peer, action, e[i][3], e[i][4]});
    }
  }
  return steps;
}

}  // namespace

std::string RunInfo::title() const {
  return schedule->name + ", P=" + std::to_string(ranks()) +
         (copies > 1 ? ", D=" + std::to_string(copies) : "") +
         ", M=" + std::to_string(microbatches);
}

RunInfo run_info(const TrainingPlan& plan) {
  RunInfo run(plan.schedule);
  run.copies = plan.copies;
  run.microbatches = plan.microbatches();
  run.steps = plan.steps;
  run.first_step = plan.first_step;
  run.batch_size = plan.data.batch_size;
  run.dp_shares = plan.dp_shares;
  run.tokens_per_sample = plan.tokens_per_sample;
  run.asynchronous = plan.asynchronous();
  run.stage_layers = format_stage_layers(plan.stage_layers);
  const int P = plan.ranks(), S = plan.num_stages();
  // Unequal shares: each copy's own ("6,2").
  std::string microbatch_sizes;
  for (int d = 0; d < (plan.dp_shares.empty() ? 1 : plan.copies); ++d) {
    microbatch_sizes += (d > 0 ? "," : "") + std::to_string(plan.copy_microbatch_size(d));
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "training %s (%d layers, d_model %d) with %s: %d rank%s, %d stage%s, %d "
                "microbatches of %s",
                plan.model.kind.c_str(), num_layers(plan.model), plan.model.d_model,
                plan.schedule->name.c_str(), P, P == 1 ? "" : "s", S, S == 1 ? "" : "s",
                plan.microbatches(), microbatch_sizes.c_str());
  run.header = line;
  run.header += "\n" + describe_stage_layers(plan.model, plan.partition, plan.stage_layers);
  if (!plan.placement.empty()) {
    std::string workers;
    for (size_t r = 0; r < plan.placement.size(); ++r) {
      workers += (r > 0 ? ", " : "") + std::string("rank ") + std::to_string(r) + " on worker " +
                 std::to_string(plan.placement[r]);
    }
    run.header += "\nplacement " + format_placement(plan.placement) + ": " + workers;
  }
  if (plan.copies > 1 && plan.dp_shares.empty()) {
    std::snprintf(line, sizeof line,
                  "%d copies of the pipeline (--dp), %d ranks: each trains on 1/%d of the batch",
                  plan.copies, plan.world_size(), plan.copies);
    run.header += std::string("\n") + line;
  } else if (plan.copies > 1) {
    std::snprintf(line, sizeof line,
                  "%d copies of the pipeline (--dp), %d ranks: shares %s of the batch of %d "
                  "(--dp-shares), their gradients weighed by them",
                  plan.copies, plan.world_size(), format_dp_shares(plan.dp_shares).c_str(),
                  plan.data.batch_size);
    run.header += std::string("\n") + line;
  }
  if (plan.precision != Precision::kFp32) {
    run.header += std::string("\nprecision ") + precision_name(plan.precision) +
                  ": forwards under autocast, activations and messages in it, float32 master "
                  "weights" +
                  (scales_loss(plan.precision) ? ", the loss scaled" : "") +
                  (plan.casts_per_step ? ", each weight cast once per step" : "");
  }
  // Which kernels compute the run (torch's wheel's own): figures of runs compare only with it.
  run.header += "\n" + compute_kernels_line();
  if (!plan.resume_dir.empty()) {
    run.header +=
        "\nresuming " + plan.resume_dir + " after step " + std::to_string(plan.first_step);
    if (plan.resumed_precision != precision_name(plan.precision)) {
      run.header += " (trained at " + plan.resumed_precision + ", going on at " +
                    precision_name(plan.precision) +
                    ": the float32 parameters and optimizer state carry over as they are" +
                    (scales_loss(plan.precision) ? ", the loss scale starts afresh)" : ")");
    }
  }
  run.save_dir = plan.save_dir;
  return run;
}

std::optional<StepReport> gather_step_report(const RunInfo& run, int step, double grad_norm,
                                             const RankStep& mine, Transport& transport,
                                             std::vector<PendingComm>* unsent) {
  const std::vector<RankStep> ranks = gather(mine, transport, unsent);
  if (transport.rank() != 0) return std::nullopt;
  StepReport report;
  report.step = step + 1;
  report.steps = run.steps;
  report.grad_norm = grad_norm;
  report.loss_scale = mine.loss_scale;  // every rank's
  report.skipped = mine.skipped;
  Timeline& timeline = report.timeline;
  timeline.title = run.title() + " (measured, step " + std::to_string(report.step) + ")";
  // One row per world rank: with --dp, copy d's pipeline ranks are rows d x P .. d x P + P - 1.
  timeline.num_ranks = run.world_size();
  timeline.unit = TimeUnit::kSeconds;
  double squared_norm = 0;
  // Each copy of the pipeline (--dp) divided its losses by its own M: their mean, or with
  // unequal shares each weighed by its share. The replicas of a replicated last stage divided
  // theirs by the step's M: their sum.
  const bool weighed = !run.dp_shares.empty();
  for (size_t world_rank = 0; world_rank < ranks.size(); ++world_rank) {
    const RankStep& r = ranks[world_rank];
    const int copy = static_cast<int>(world_rank) / run.ranks();
    if (r.has_loss) report.loss += weighed ? r.loss * share_weight(run.dp_shares, copy) : r.loss;
    report.step_seconds = std::max(report.step_seconds, r.seconds);
    report.rank_seconds.push_back(r.seconds);
    report.peak_activation_bytes.push_back(r.peak_activation_bytes);
    report.weight_versions.push_back(r.weight_versions);
    report.optimizer_state_bytes.push_back(r.optimizer_state_bytes);
    report.bytes_sent.push_back(r.bytes_sent);
    report.weight_bytes.push_back(r.weight_bytes);
    report.compute_s.push_back(r.compute_s);
    report.rollbacks += r.rollbacks;
    report.checkpoint_stall_s = std::max(report.checkpoint_stall_s, r.checkpoint_stall_s);
    report.resident_bytes.push_back(r.resident_bytes);
    report.peak_memory_bytes.push_back(r.peak_memory_bytes);
    report.predicted_peak_memory_bytes.push_back(r.predicted_peak_memory_bytes);
    report.predicted_memory.push_back(r.predicted_memory);
    if (run.asynchronous) squared_norm += r.grad_norm_squared;
    // Each rank timed its events from its own start after the barrier; on rank 0's clock they
    // begin (start_s - rank 0's start_s) later. Worker processes of one host share the steady
    // clock; a gap of a second or more means they do not (other hosts), and the ranks' starts
    // are taken as simultaneous instead.
    double offset = r.start_s - ranks[0].start_s;
    if (std::abs(offset) >= 1.0) offset = 0;
    for (TimelineEvent e : r.events) {
      e.rank = static_cast<int>(world_rank);
      e.start += offset;
      e.end += offset;
      timeline.events.push_back(e);
    }
  }
  if (!weighed) report.loss /= run.copies;
  if (run.asynchronous) report.grad_norm = std::sqrt(squared_norm);
  report.stats = timeline_stats(timeline);
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, ", bubble %.1f%%", 100 * report.stats.bubble_ratio);
  timeline.title += bubble;
  report.samples_per_s = static_cast<double>(run.batch_size) / report.step_seconds;
  report.tokens_per_s = report.samples_per_s * run.tokens_per_sample;
  return report;
}

}  // namespace pptrain
