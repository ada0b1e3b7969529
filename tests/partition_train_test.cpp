// End-to-end tests of `pptrain train --partition` and of bad profiles given to `pptrain partition`.
//
// A partition only moves layers between stages, so whatever the cut, a pipelined run must still
// equal --pp 1 (losses of every step and final parameters to 1e-5 relative), and the launcher
// must hand every worker the same ranges. Bad partitions and profiles get exit status 2 and one
// line naming the problem.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/planner/planner.h"
#include "pptrain/train/partition_plan.h"
#include "pptrain/train/plan.h"
#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;

// A partition as `pptrain partition --json` prints it.
std::string partition_json(const std::vector<std::pair<int, int>>& ranges, int replicas = 1) {
  nlohmann::json doc = {{"method", "time"}, {"stages", nlohmann::json::array()}};
  for (const auto& [first, last] : ranges) {
    doc["stages"].push_back({{"first_layer", first},
                             {"last_layer", last},
                             {"replicas", replicas},
                             {"compute_s", 0.001}});
  }
  return doc.dump();
}

// A profile as `pptrain profile` writes it: the model's layer names, made-up costs.
nlohmann::json profile_doc(const ModelOptions& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (int i = 0; i < num_layers(model); ++i) {
    layers.push_back({{"name", layer_name(model, i)},
                      {"forward_ms", 1.0 + i},
                      {"backward_input_ms", 1.0},
                      {"backward_weight_ms", 1.0},
                      {"activation_bytes", 1024},
                      {"stash_bytes", 4096},
                      {"parameter_bytes", 8192}});
  }
  return {{"format", "pptrain-profile-1"}, {"layers", layers}};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The "partition ..." line of a run's stdout (empty if there is none, or more than one).
std::string partition_line(const std::string& out) {
  std::string found;
  int count = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("partition ", 0) == 0) {
      found = line;
      ++count;
    }
  }
  return count == 1 ? found : "";
}

// Trains `args` with --pp 1 and with `pipelined` (which adds --pp and --partition; its
// environment assignments `env`), `steps` steps each, and checks losses and parameters agree;
// returns the pipelined run.
RunResult expect_matches_single_process(const ModelOptions& model, const std::string& args,
                                        const std::string& pipelined, const TempDir& dir,
                                        int steps = 5, const std::string& env = "") {
  const std::string common = model_args(model) + " --batch-size 8 --microbatches 4 --steps " +
                             std::to_string(steps) + " " + args;
  const auto ref = run_train(common + " --pp 1 --quiet --metrics " + (dir / "ref.jsonl").string() +
                                 " --save " + (dir / "ref").string(),
                             dir);
  EXPECT_EQ(ref.exit_code, 0) << ref.err;
  // Not quiet: the run prints its partition line.
  const auto run = run_train(common + " " + pipelined + " --metrics " +
                                 (dir / "run.jsonl").string() + " --save " + (dir / "run").string(),
                             dir, env);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  if (ref.exit_code != 0 || run.exit_code != 0) return run;
  const auto want = read_losses(dir / "ref.jsonl");
  EXPECT_EQ(want.size(), static_cast<size_t>(steps));
  expect_same_losses(read_losses(dir / "run.jsonl"), want);
  expect_same_parameters(model, dir / "run", dir / "ref");
  return run;
}

// gpt with 8 blocks is 10 layers; uniform on 2 stages is 0-4, 5-9. This cut puts only the
// embedding and one block on the first stage.
TEST(PartitionFile, NonUniformOnTwoRanksEqualsSingleProcess) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  write_file(dir / "p.json", partition_json({{0, 1}, {2, 9}}));
  const auto run = expect_matches_single_process(
      model, "--schedule 1f1b", "--pp 2 --partition " + (dir / "p.json").string(), dir);
  EXPECT_EQ(partition_line(run.out),
            "partition " + (dir / "p.json").string() +
                ": stage 0 = layers 0-1 (embedding..block0), stage 1 = layers 2-9 (block1..head)")
      << run.out;
}

// Four stages in a V on two ranks (zb-v): stage 0 and 3 on rank 0, with one-layer stages.
TEST(PartitionFile, NonUniformVShapeEqualsSingleProcess) {
  const ModelOptions model = small_model("mlp");
  TempDir dir;
  write_file(dir / "p.json", partition_json({{0, 0}, {1, 5}, {6, 6}, {7, 7}}));
  const auto run = expect_matches_single_process(
      model, "--schedule zb-v", "--pp 2 --partition " + (dir / "p.json").string(), dir);
  EXPECT_NE(
      partition_line(run.out).find("stage 1 = layers 1-5 (block1..block5), stage 2 = layer 6"),
      std::string::npos)
      << run.out;
}

// zb-auto without --cost plans for the times of the profile given as --partition (stage 1 is
// slower here: forward_ms grows with the layer), and trains like --pp 1.
TEST(PartitionFile, ZbAutoPlansForTheProfilesTimes) {
  const ModelOptions model = small_model("mlp");
  TempDir dir;
  write_file(dir / "prof.json", profile_doc(model).dump());
  expect_matches_single_process(model, "--schedule zb-auto --memory-limit 2",
                                "--pp 2 --partition " + (dir / "prof.json").string(), dir);
}

// A placement only changes which process plays which rank: three ranks placed 2,0,1 (process 2
// runs stage 0) and two copies of a two-rank pipeline placed backwards (the copies' groups then
// join other processes) train as --pp 1.
TEST(Placement, RanksPlacedOtherwiseEqualSingleProcess) {
  const ModelOptions model = small_model("gpt");
  {
    TempDir dir;
    expect_matches_single_process(model, "--schedule 1f1b", "--pp 3 --placement 2,0,1", dir);
  }
  TempDir dir;
  expect_matches_single_process(model, "--schedule 1f1b", "--pp 2 --dp 2 --placement 3,2,1,0", dir);
}

// The smallest limit that works on `rank`, in bytes, from a one-line error (0 if none).
long long smallest_limit(const RunResult& run, int rank) {
  const std::string key = "the smallest limit that works on rank " + std::to_string(rank) + " is ";
  const size_t at = run.err.find(key);
  if (at == std::string::npos) return 0;
  const size_t open = run.err.find('(', at);
  return open == std::string::npos ? 0 : std::stoll(run.err.substr(open + 1));
}

// --partition workers places a worker whose memory limit is too small for stage 0 (the one that
// holds two microbatches under 1F1B) on stage 1, where it fits, and the run still equals --pp 1.
TEST(Placement, WorkersPutASmallLimitWhereItFits) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string workers = model_args(model) +
                              " --batch-size 8 --microbatches 4 --steps 1 --quiet --pp 2 "
                              "--partition workers --worker-memory-limits ";
  // What each rank needs at least, the other unlimited (neither fits 1e5 bytes).
  const long long rank0 = smallest_limit(run_train(workers + "1e5,0", dir), 0);
  const long long rank1 = smallest_limit(run_train(workers + "0,1e5", dir), 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  if (rank0 == rank1) GTEST_SKIP() << "both ranks need " << rank0 << " bytes";
  // The worker with the smaller of the two limits cannot be rank 0 when rank 0 needs more.
  const std::string limits =
      rank0 > rank1 ? std::to_string(rank1) + ",0" : "0," + std::to_string(rank0);
  const auto run = expect_matches_single_process(
      model, "--schedule 1f1b", "--pp 2 --partition workers --worker-memory-limits " + limits, dir);
  EXPECT_NE(run.err.find(", placement 1,0, predicted peaks"), std::string::npos) << run.err;
}

// What worker 0's memory limit must be, in bytes, for it to hold stage `stage` of `cut` (1F1B on
// 2 ranks, 4 microbatches of 2 samples), by the memory model --replan auto cuts with, on this
// process's profile of the model's layers: their bytes, unlike their times, are the run's.
double limit_for(const ModelOptions& model, const std::vector<LayerRange>& cut, int stage) {
  StageLayerOptions layers;
  layers.model = model;
  layers.microbatch_size = 2;
  PlannerOptions planner;
  planner.workers = 2;
  planner.microbatches = {4};
  planner.profile_microbatch_size = 2;
  planner.batch_size = 8;
  planner.optimizer_state_factor = optimizer_state_factor(TrainOptions().optimizer);
  Candidate shape;
  shape.schedule = "1f1b";
  shape.microbatches = 4;
  const double peak = cut_peak_bytes(profile_layers(layers), planner, shape, {cut})[0][stage];
  return peak / (1 - planner.memory_margin);
}

// --replan auto moves ranks to other workers when that is what fits. Worker 1 tells the watch
// (a test hook) that it computes 4x as long from step 5 on; worker 0 may hold any cut's stage 1
// (under 1F1B one microbatch in flight), but not 8 layers of stage 0 (two in flight). Kept in
// place, worker 0 can take few layers off the slow worker 1; swapped, worker 1 plays stage 0
// with a layer or two. The run moves to placement 1,0 (after step 8), says so in one line, goes on
// in the same processes (rank 0's metrics from worker 1 then), and equals --pp 1.
TEST(Replan, MovesRanksToOtherWorkersWithinTheirLimits) {
  ModelOptions model = small_model("gpt");
  model.seq_len = 64;  // activations outweigh the parameters, so stage 0 needs the most room
  const double limit = limit_for(model, {{0, 0}, {1, 9}}, 1) * 1.01;
  ASSERT_GT(limit_for(model, {{0, 7}, {8, 9}}, 0), limit * 1.05)
      << "worker 0 would hold 8 layers of stage 0: the case needs a model with more activations";
  TempDir dir;
  const auto run = expect_matches_single_process(
      model, "--schedule 1f1b",
      "--pp 2 --replan auto --worker-memory-limits " +
          std::to_string(static_cast<long long>(limit)) + ",0",
      dir, 12, "PPTRAIN_TEST_SLOW_WORKER=1 PPTRAIN_TEST_SLOW_STEP=5 PPTRAIN_TEST_SLOW_FACTOR=4 ");
  const size_t at = run.err.find("pptrain: --replan auto after step ");
  ASSERT_NE(at, std::string::npos) << run.err;
  const std::string line = run.err.substr(at, run.err.find('\n', at) - at);
  EXPECT_NE(line.find(": rank 1 computes "), std::string::npos) << line;
  EXPECT_NE(line.find("; stage layers 0-4,5-9 -> "), std::string::npos) << line;
  EXPECT_NE(line.find(", placement 1,0 (slowest stage"), std::string::npos) << line;
}

// gpt with d_model 16: the embedding (256 + 16 positions) x 16 and the head (LayerNorm + 16 x
// 256) weigh more than a block (about 12 x 16 x 16), so balanced parameter bytes give the
// end stages fewer blocks than uniform does: 0-1, 2-4, 5-7, 8-9 (largest stage 3 blocks,
// about 9.3k parameters) instead of 0-2, 3-4, 5-6, 7-9 (embedding + 2 blocks, about 10.6k).
TEST(PartitionParams, GptBalancesParameterBytes) {
  ModelOptions model = small_model("gpt");
  model.d_model = 16;
  TempDir dir;
  const auto run = expect_matches_single_process(model, "--schedule interleaved-1f1b",
                                                 "--pp 2 --partition params", dir);
  EXPECT_EQ(partition_line(run.out),
            "partition params: stage 0 = layers 0-1 (embedding..block0), stage 1 = layers 2-4 "
            "(block1..block3), stage 2 = layers 5-7 (block4..block6), stage 3 = layers 8-9 "
            "(block7..head)")
      << run.out;
}

// Equal blocks: params is the uniform split.
TEST(PartitionParams, MlpEqualBlocksSplitEvenly) {
  TempDir dir;
  const auto run = expect_matches_single_process(small_model("mlp"), "--schedule 1f1b",
                                                 "--pp 2 --partition params", dir);
  EXPECT_EQ(partition_line(run.out),
            "partition params: stage 0 = layers 0-3 (block0..block3), stage 1 = layers 4-7 "
            "(block4..block7)")
      << run.out;
}

// `time` profiles in the launcher; a profile file is cut with `time` the same way `pptrain
// partition` cuts it. The ranges depend on the machine's timings, so the test checks that train
// and partition agree, not which ranges they chose.
TEST(PartitionTime, MeasuredAndFromProfileFile) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  expect_matches_single_process(model, "--schedule 1f1b", "--pp 2 --partition time", dir);

  const auto profiled = run_pptrain("profile " + model_args(model) +
                                        " --microbatch-size 2 --warmup 1 --iters 3 --out " +
                                        (dir / "prof.json").string(),
                                    dir);
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  const auto cut = run_pptrain(
      "partition --method time --pp 2 --json --profile " + (dir / "prof.json").string(), dir);
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  const auto stages = nlohmann::json::parse(cut.out).at("stages");
  ASSERT_EQ(stages.size(), 2u);
  std::vector<LayerRange> expected;
  for (const auto& s : stages) expected.emplace_back(s["first_layer"], s["last_layer"]);

  const auto run =
      run_train(model_args(model) + " --pp 2 --schedule 1f1b --batch-size 8 " +
                    "--microbatches 4 --steps 1 --partition " + (dir / "prof.json").string(),
                dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(partition_line(run.out),
            describe_stage_layers(model, (dir / "prof.json").string(), expected))
      << run.out;
}

// Bad input, to `pptrain train --partition` and `pptrain partition`: exit status 2, one line.
struct BadInput {
  std::string name;
  std::string args;      // DIR/ stands for the case's scratch folder
  std::string expected;  // part of the message
  std::string env;       // extra environment
};

void PrintTo(const BadInput& input, std::ostream* out) {
  *out << input.name;
}

class RejectsBadPartition : public ::testing::TestWithParam<BadInput> {};

TEST_P(RejectsBadPartition, OneLineAndExitStatus2) {
  TempDir dir;
  ModelOptions model = small_model("gpt");  // 8 blocks: 10 layers
  write_file(dir / "ten_layers.json", partition_json({{0, 4}, {5, 9}}));
  write_file(dir / "ten_layer_profile.json", profile_doc(model).dump());
  model.layers = 4;  // what the cases train: 6 layers
  auto missing = profile_doc(model);
  missing["layers"][2].erase("forward_ms");
  write_file(dir / "missing_field.json", missing.dump());
  auto negative = profile_doc(model);
  negative["layers"][1]["backward_input_ms"] = -1.5;
  write_file(dir / "negative.json", negative.dump());
  write_file(dir / "profile.json", profile_doc(model).dump());
  write_file(dir / "replicas.json", partition_json({{0, 2}, {3, 5}}, 2));
  write_file(dir / "three_stages.json", partition_json({{0, 1}, {2, 3}, {4, 5}}));
  write_file(dir / "hello.txt", "hello\n");
  ModelOptions three = model;
  three.kind = "mlp";
  three.layers = 3;
  write_file(dir / "three_layers.json", profile_doc(three).dump());
  write_file(dir / "cycle.txt",
             "node1 -- Conv -- forward_compute_time=1.0, backward_compute_time=2.0, "
             "activation_size=64.0, parameter_size=16.0\n"
             "node2 -- ReLU -- forward_compute_time=1.0, backward_compute_time=2.0, "
             "activation_size=64.0, parameter_size=0.0\n"
             "\tnode1 -- node2\n\tnode2 -- node1\n");

  std::string args = GetParam().args;
  const std::string placeholder = "DIR/";
  for (size_t at; (at = args.find(placeholder)) != std::string::npos;) {
    args.replace(at, placeholder.size(), (dir / "").string());
  }
  if (args.rfind("train ", 0) == 0) {
    if (args.find("--schedule") == std::string::npos) args += " --schedule 1f1b";
    args += " " + model_args(model) + " --microbatches 4 --batch-size 8 --steps 1";
  }
  expect_one_line_error(run_pptrain(args, dir, GetParam().env), GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RejectsBadPartition,
    ::testing::Values(
        BadInput{"TrainPartitionForOtherModelSize", "train --pp 2 --partition DIR/ten_layers.json",
                 "stage 1 ends at layer 9, but the model has layers 0-5 only: gpt --layers 4", ""},
        BadInput{"TrainProfileForOtherModelSize",
                 "train --pp 2 --partition DIR/ten_layer_profile.json",
                 "is a profile of 10 layers, but the model has 6", ""},
        BadInput{"TrainProfileMissingField", "train --pp 2 --partition DIR/missing_field.json",
                 "layer 2 ('block1'): missing field 'forward_ms'", ""},
        BadInput{"TrainProfileNegativeTime", "train --pp 2 --partition DIR/negative.json",
                 "field 'backward_input_ms' must be >= 0, got -1.5", ""},
        BadInput{"TrainMoreStagesThanLayers",
                 "train --pp 2 --schedule interleaved-1f1b --chunks 4 --partition DIR/profile.json",
                 "has 8 stages (--pp 2 x 4 chunks)", ""},
        BadInput{"TrainReplicatedStage", "train --pp 2 --partition DIR/replicas.json",
                 "workers (their replicas), but --pp is 2", ""},
        BadInput{"TrainWrongStageCount", "train --pp 2 --partition DIR/three_stages.json",
                 "has 3 stages, but the run has 2 (--pp 2 x 1 chunk)", ""},
        BadInput{"TrainUnknownMethod", "train --pp 2 --partition fastest",
                 "--partition 'fastest': expected uniform, params, time, workers, or an existing",
                 ""},
        BadInput{"TrainNeitherPartitionNorProfile", "train --pp 2 --partition DIR/hello.txt",
                 "is neither a partition JSON", ""},
        BadInput{"TrainTimeUnderTorchrun", "train --pp 2 --partition time",
                 "--partition time would time the layers in every rank",
                 "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "},
        BadInput{"TrainBadStageLayers", "train --pp 2 --stage-layers 0-2,x",
                 "--stage-layers '0-2,x': bad range 'x'", ""},
        BadInput{"TrainEmptyStage", "train --pp 2 --stage-layers 0-5,6-5",
                 "stage 1 has layers 6-5, expected a non-empty range starting at layer 6", ""},
        BadInput{"PartitionMissingField",
                 "partition --profile DIR/missing_field.json --method time --pp 2",
                 "layer 2 ('block1'): missing field 'forward_ms'", ""},
        BadInput{"PartitionNegativeTime",
                 "partition --profile DIR/negative.json --method time --pp 2",
                 "field 'backward_input_ms' must be >= 0, got -1.5", ""},
        BadInput{"PartitionMoreStagesThanLayers",
                 "partition --profile DIR/three_layers.json --method time --pp 5",
                 "cannot cut 3 layers into 5 stages", ""},
        BadInput{"PartitionCycle", "partition --profile DIR/cycle.txt --method time --pp 2",
                 "cycle", ""}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

}  // namespace
}  // namespace pptrain
