#include "pptrain/models/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <thread>

#include "pptrain/common/check.h"
#include "pptrain/common/malloc.h"
#include "pptrain/common/stats.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/device/memory.h"
#include "pptrain/device/precision.h"
#include "pptrain/models/tensor_bundle.h"
#include "pptrain/models/weight_grad_store.h"

namespace pptrain {
namespace {

std::string hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// A real input for layer 0: byte tokens for gpt, unit normal features for mlp.
torch::Tensor first_input(const ModelOptions& model, int64_t microbatch_size) {
  auto shape = layer_input_shape(model, 0, microbatch_size);
  if (layer_input_dtype(model, 0) == torch::kInt64) {
    return torch::randint(0, model.vocab_size, shape, torch::kInt64);
  }
  return torch::randn(shape);
}

// The layer's forward at the run's precision, as a stage runs it (runtime/stage.h): under
// autocast, its float32 output in the compute dtype.
torch::Tensor forward_at(torch::nn::AnyModule& layer, const torch::Tensor& x,
                         std::optional<c10::ScalarType> compute) {
  if (!compute) return layer.forward(x);
  AutocastScope autocast(compute);
  return with_dtype(layer.forward(x), torch::kFloat32, *compute).only();
}

LayerProfile profile_layer(const ProfileOptions& options, int index, torch::nn::AnyModule& layer,
                           const torch::Tensor& input) {
  PPTRAIN_CHECK(!layer_takes_bundle(options.model, index), "pptrain profile: the ",
                options.model.kind, " model's layers take bundles of tensors, which the profiler ",
                "does not time yet; profile gpt or mlp");
  LayerProfile result;
  result.name = layer_name(options.model, index);
  for (const auto& p : layer.ptr()->parameters()) result.parameter_bytes += tensor_bytes(p);

  std::vector<double> forward_ms, input_ms, weight_ms, stash_bytes, weight_stash_bytes,
      forward_transient, backward_transient;
  // The last layer computes the loss too, as the last stage does in a run (its forward keeps
  // what the loss's backward needs, and its backward starts from the loss): targets of the
  // model's kind (compute_loss), made outside the measured windows.
  const bool last = index == num_layers(options.model) - 1;
  const std::optional<c10::ScalarType> compute = compute_dtype(options.precision);
  const torch::Tensor target =
      !last ? torch::Tensor()
      : options.model.kind == "gpt"
          ? torch::randint(0, options.model.vocab_size, {input.size(0), options.model.seq_len},
                           torch::kInt64)
          : torch::randn(layer_output_shape(options.model, index, input.size(0)));
  for (int iter = 0; iter < options.warmup + options.iters; ++iter) {
    // The input needs a gradient so that I computes dX, as it does inside a pipeline stage.
    torch::Tensor x = input.is_floating_point() ? input.detach().requires_grad_(true) : input;
    // Zeroed in place, as in a run: W then frees what it held without allocating gradients.
    for (auto& p : layer.ptr()->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }

    // Each action's working memory is what it held above both its ends, as the executor
    // records it (runtime/executor.h: ActionBytes).
    const int64_t before = allocated_bytes();
    reset_window_peak();
    double start = thread_cpu_ms();
    torch::Tensor output = forward_at(layer, x, compute);
    const torch::Tensor loss =
        last ? compute_loss(options.model, output.to(torch::kFloat32), target) : torch::Tensor();
    const double f_ms = thread_cpu_ms() - start;
    const int64_t after = allocated_bytes();
    const int64_t forward_peak = window_peak_bytes();
    result.activation_bytes = static_cast<double>(tensor_bytes(output));

    const torch::Tensor grad_output = last ? torch::Tensor() : torch::randn_like(output);
    WeightGradStore store;
    const int64_t before_i = allocated_bytes();
    reset_window_peak();
    start = thread_cpu_ms();
    {
      DeferWeightGrads defer(&store);
      if (last) {
        loss.backward();
      } else {
        output.backward(grad_output);
      }
    }
    const double i_ms = thread_cpu_ms() - start;
    const int64_t before_w = allocated_bytes();
    const int64_t input_peak = window_peak_bytes();
    reset_window_peak();
    start = thread_cpu_ms();
    store.run();
    const double w_ms = thread_cpu_ms() - start;
    const int64_t after_w = allocated_bytes();
    const int64_t weight_peak = window_peak_bytes();

    if (iter < options.warmup) continue;
    forward_ms.push_back(f_ms);
    input_ms.push_back(i_ms);
    weight_ms.push_back(w_ms);
    stash_bytes.push_back(static_cast<double>(after - before));
    weight_stash_bytes.push_back(static_cast<double>(before_w - after_w));
    forward_transient.push_back(static_cast<double>(forward_peak - std::max(before, after)));
    backward_transient.push_back(static_cast<double>(
        std::max(input_peak - std::max(before_i, before_w), weight_peak - before_w)));
  }
  result.forward_ms = median(forward_ms);
  result.backward_input_ms = median(input_ms);
  result.backward_weight_ms = median(weight_ms);
  result.stash_bytes = std::max(0.0, median(stash_bytes));
  result.weight_stash_bytes = std::clamp(median(weight_stash_bytes), 0.0, result.stash_bytes);
  result.forward_transient_bytes = std::max(0.0, median(forward_transient));
  result.backward_transient_bytes = std::max(0.0, median(backward_transient));
  return result;
}

// Of each of `layer`'s bytes that grow with the microbatch, the part that does not (its fixed
// part), from the same bytes measured at one sample (`at_one`): a line through the two sizes,
// samples x per-sample + fixed, its fixed part kept within [0, bytes].
void set_fixed_parts(LayerProfile& layer, const LayerProfile& at_one, int samples) {
  const auto fixed = [samples](double bytes, double one) {
    return std::clamp((samples * one - bytes) / (samples - 1), 0.0, std::max(bytes, 0.0));
  };
  layer.stash_fixed_bytes = fixed(layer.stash_bytes, at_one.stash_bytes);
  layer.forward_transient_fixed_bytes =
      fixed(layer.forward_transient_bytes, at_one.forward_transient_bytes);
  layer.backward_transient_fixed_bytes =
      fixed(layer.backward_transient_bytes, at_one.backward_transient_bytes);
}

}  // namespace

ModelProfile profile_model(const ProfileOptions& options) {
  check_options(options.model);
  PPTRAIN_CHECK(options.microbatch_size >= 1, "--microbatch-size must be >= 1, got ",
                options.microbatch_size);
  PPTRAIN_CHECK(options.warmup >= 0, "--warmup must be >= 0, got ", options.warmup);
  PPTRAIN_CHECK(options.iters >= 1, "--iters must be >= 1, got ", options.iters);

  set_compute_threads(1);        // thread CPU time must see all the work (compute_threads.h)
  install_counting_allocator();  // for stash_bytes
  keep_freed_memory();           // as in a run, so fresh pages are not counted as compute
  ModelProfile profile;
  profile.options = options;
  profile.threads = torch::get_num_threads();
  profile.hostname = hostname();
  profile.cpus = static_cast<int>(std::thread::hardware_concurrency());
  profile.torch_version = TORCH_VERSION;

  torch::Tensor input = first_input(options.model, options.microbatch_size);
  profile.input_bytes = static_cast<double>(tensor_bytes(input));
  for (int index = 0; index < num_layers(options.model); ++index) {
    torch::nn::AnyModule layer = make_layer(options.model, index);
    LayerProfile measured = profile_layer(options, index, layer, input);
    if (options.microbatch_size > 1) {
      // The bytes again at one sample (memory is the same each time: two iterations).
      ProfileOptions once = options;
      once.warmup = 1;
      once.iters = 2;
      set_fixed_parts(measured, profile_layer(once, index, layer, input.narrow(0, 0, 1)),
                      options.microbatch_size);
    }
    profile.layers.push_back(std::move(measured));
    torch::NoGradGuard no_grad;
    input = forward_at(layer, input, compute_dtype(options.precision));  // the next one's input
  }
  // The targets (models/model.h, compute_loss): gpt's are token ids as its inputs, the others'
  // have the last layer's output's shape.
  profile.target_bytes =
      options.model.kind == "gpt" ? profile.input_bytes : static_cast<double>(tensor_bytes(input));
  return profile;
}

nlohmann::json profile_to_json(const ModelProfile& profile) {
  const ModelOptions& model = profile.options.model;
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerProfile& layer : profile.layers) {
    layers.push_back(
        {{"name", layer.name},
         {"forward_ms", layer.forward_ms},
         {"backward_input_ms", layer.backward_input_ms},
         {"backward_weight_ms", layer.backward_weight_ms},
         // Whole bytes: LayerProfile keeps doubles only because PipeDream's are.
         {"activation_bytes", static_cast<int64_t>(layer.activation_bytes)},
         {"stash_bytes", static_cast<int64_t>(layer.stash_bytes)},
         {"weight_stash_bytes", static_cast<int64_t>(layer.weight_stash_bytes)},
         {"forward_transient_bytes", static_cast<int64_t>(layer.forward_transient_bytes)},
         {"backward_transient_bytes", static_cast<int64_t>(layer.backward_transient_bytes)},
         {"stash_fixed_bytes", static_cast<int64_t>(layer.stash_fixed_bytes)},
         {"forward_transient_fixed_bytes",
          static_cast<int64_t>(layer.forward_transient_fixed_bytes)},
         {"backward_transient_fixed_bytes",
          static_cast<int64_t>(layer.backward_transient_fixed_bytes)},
         {"parameter_bytes", static_cast<int64_t>(layer.parameter_bytes)}});
  }
  nlohmann::json out = {{"format", "pptrain-profile-1"},
                        {"model",
                         {{"kind", model.kind},
                          {"layers", model.layers},
                          {"d_model", model.d_model},
                          {"heads", model.heads},
                          {"seq_len", model.seq_len},
                          {"vocab_size", model.vocab_size}}},
                        {"settings",
                         {{"microbatch_size", profile.options.microbatch_size},
                          {"warmup", profile.options.warmup},
                          {"iters", profile.options.iters},
                          {"threads", profile.threads},
                          {"clock", "thread_cpu_time"}}},
                        {"machine",
                         {{"hostname", profile.hostname},
                          {"cpus", profile.cpus},
                          {"torch_version", profile.torch_version}}},
                        {"batch",
                         {{"input_bytes", static_cast<int64_t>(profile.input_bytes)},
                          {"target_bytes", static_cast<int64_t>(profile.target_bytes)}}},
                        {"layers", layers}};
  // A profile at fp32 says none (and reads as one of an older pptrain's).
  if (profile.options.precision != Precision::kFp32) {
    out["settings"]["precision"] = precision_name(profile.options.precision);
  }
  if (profile.network.measured()) {
    out["network"] = {{"allreduce_ranks", profile.network.ranks},
                      {"allreduce_bandwidth_bytes_per_s", profile.network.bandwidth_bytes_per_s},
                      {"allreduce_latency_ms", profile.network.latency_ms}};
  }
  if (profile.overheads.measured()) {
    out["overheads"] = {{"action_ms", profile.overheads.action_ms},
                        {"send_ms", profile.overheads.send_ms},
                        {"recv_ms", profile.overheads.recv_ms}};
  }
  return out;
}

void write_profile_json(const ModelProfile& profile, const std::string& path) {
  std::ofstream out(path);
  PPTRAIN_CHECK(out.good(), "--out: cannot write '", path, "'");
  out << profile_to_json(profile).dump(2) << "\n";
  out.close();
  PPTRAIN_CHECK(out.good(), "--out: failed writing '", path, "'");
}

}  // namespace pptrain
