// `pptrain profile`: per-layer costs of a model on this machine, as pptrain-profile-1 JSON for
// `pptrain partition` and `pptrain plan`, with what an action and a message cost the runtime
// beyond their work here (runtime/overhead_probe.h: about half a second; always measured).
//
//   pptrain profile --model gpt --layers 4 --d-model 64 --microbatch-size 4 --out gpt.json
#include <cstdio>
#include <memory>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/device/kernels.h"
#include "pptrain/models/profiler.h"
#include "pptrain/runtime/allreduce_probe.h"
#include "pptrain/runtime/overhead_probe.h"
#include "tools/pptrain/commands.h"

namespace pptrain::cli {

void add_profile_command(CLI::App& app) {
  auto options = std::make_shared<ProfileOptions>();
  auto out_path = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "profile", "Time each layer of a model alone (one thread) and write a profile JSON");
  command->add_option("--model", options->model.kind, "Model: gpt or mlp")->capture_default_str();
  command->add_option("--layers", options->model.layers, "Transformer / MLP blocks")
      ->capture_default_str();
  command->add_option("--d-model", options->model.d_model, "Model width")->capture_default_str();
  command->add_option("--heads", options->model.heads, "Attention heads (gpt)")
      ->capture_default_str();
  command->add_option("--seq-len", options->model.seq_len, "Tokens per sample (gpt)")
      ->capture_default_str();
  command->add_option("--microbatch-size", options->microbatch_size, "Samples per microbatch")
      ->capture_default_str();
  command->add_option("--warmup", options->warmup, "Unmeasured iterations per layer")
      ->capture_default_str();
  command->add_option("--iters", options->iters, "Measured iterations per layer (median)")
      ->capture_default_str();
  command->add_option("--seed", options->model.seed, "Model seed")->capture_default_str();
  auto precision = std::make_shared<std::string>("fp32");
  command
      ->add_option("--precision", *precision,
                   "What the layers compute in: fp32, bf16 or fp16 (as `train --precision` "
                   "computes: under autocast, each output in that dtype)")
      ->capture_default_str();
  command->add_option("--out", *out_path, "Output profile JSON file")->required();
  auto allreduce_ranks = std::make_shared<int>(2);
  command
      ->add_option("--allreduce-ranks", *allreduce_ranks,
                   "Also time Gloo all-reduces among this many local ranks (the cost of --dp "
                   "copies averaging gradients; 0: skip)")
      ->capture_default_str();

  command->callback([options, out_path, allreduce_ranks, precision] {
    PPTRAIN_CHECK(*allreduce_ranks == 0 || *allreduce_ranks >= 2,
                  "--allreduce-ranks must be 0 or >= 2, got ", *allreduce_ranks);
    options->precision = parse_precision(*precision, "--precision");
    ModelProfile profile = profile_model(*options);
    if (*allreduce_ranks > 0) profile.network = measure_allreduce(*allreduce_ranks);
    profile.overheads = measure_overheads();
    write_profile_json(profile, *out_path);
    double total_ms = 0;
    for (const LayerProfile& layer : profile.layers) {
      total_ms += layer.forward_ms + layer.backward_input_ms + layer.backward_weight_ms;
    }
    // The times hold for these kernels only.
    std::printf("%s\n", compute_kernels_line().c_str());
    std::printf("profiled %zu layers of %s (F+I+W %.3f ms per microbatch of %d%s) -> %s\n",
                profile.layers.size(), options->model.kind.c_str(), total_ms,
                options->microbatch_size,
                options->precision == Precision::kFp32
                    ? ""
                    : (std::string(" at ") + precision_name(options->precision)).c_str(),
                out_path->c_str());
    if (profile.network.measured()) {
      std::printf("all-reduce over %d ranks: %.1f MB/s, latency %.3f ms\n", profile.network.ranks,
                  profile.network.bandwidth_bytes_per_s / 1e6, profile.network.latency_ms);
    }
    std::printf("overheads: %.3f ms per compute action, %.3f ms per send, %.3f ms per receive\n",
                profile.overheads.action_ms, profile.overheads.send_ms, profile.overheads.recv_ms);
  });
}

}  // namespace pptrain::cli
