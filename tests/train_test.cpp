// End-to-end tests of `pptrain train`: the pipelined runs against the single-process reference,
// a crashing worker, and bad input. Each case runs the real binary (PPTRAIN_BINARY).
//
// The core invariant: for every schedule on 2 and 4 ranks, the losses of every step and the final
// parameters equal those of --pp 1 (same model, same microbatch split) to 1e-5 relative.
// Parameters compare per tensor as max|a - b| / max(max|b|, 1e-12) <= 1e-5.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pptrain/runtime/launcher.h"
#include "tests/e2e.h"

namespace pptrain {
namespace {

using namespace e2e;  // TempDir, run_train, read_losses, small_model, expect_same_parameters, ...

using Case = std::tuple<std::string, std::string>;  // model kind, schedule

class MatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(MatchesReference, LossesAndParametersEqualSingleProcess) {
  const auto& [kind, schedule] = GetParam();
  const ModelOptions model = small_model(kind);
  const int steps = 10;
  TempDir dir;
  // dualpipev needs a microbatch per stage: 8 on 4 ranks.
  const int microbatches = schedule == "dualpipev" ? 8 : 4;
  const std::string common = model_args(model) + " --batch-size 8 --microbatches " +
                             std::to_string(microbatches) + " --steps " + std::to_string(steps) +
                             " --quiet --schedule " + schedule;
  const auto ref = run_train(common + " --pp 1 --metrics " + (dir / "ref.jsonl").string() +
                                 " --save " + (dir / "ref").string(),
                             dir);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const auto ref_losses = read_losses(dir / "ref.jsonl");
  ASSERT_EQ(ref_losses.size(), static_cast<size_t>(steps));
  for (int pp : {2, 4}) {
    SCOPED_TRACE("--pp " + std::to_string(pp) + " --schedule " + schedule);
    expect_run_matches_reference(model, common + " --pp " + std::to_string(pp),
                                 "pp" + std::to_string(pp), dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, MatchesReference,
                         ::testing::Combine(::testing::Values("gpt", "mlp"),
                                            ::testing::Values("gpipe", "1f1b", "interleaved-1f1b",
                                                              "zb-h1", "zb-h2", "zb-v", "zb-auto",
                                                              "v-half", "v-min", "dualpipev")),
                         pair_test_name<Case>);

// Fewer microbatches than ranks (a user's small batch): interleaved-1f1b runs them as one group
// through the chunks (generators.h), 1f1b warms up with all of them; both equal one process.
TEST(FewerMicrobatchesThanRanks, PipelinesEqualOneProcess) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common =
      model_args(model) + " --batch-size 4 --microbatches 2 --steps 5 --quiet --schedule";
  run_reference(common + " interleaved-1f1b --pp 1", dir);
  expect_runs_match_reference(model, common,
                              {"interleaved-1f1b --pp 4", "interleaved-1f1b --pp 4 --recompute",
                               "1f1b --pp 4", "interleaved-1f1b --pp 3 --chunks 2"},
                              dir);
}

// --seq-len-range: every batch has its own length, which the messages' headers tell the next
// stage; the pipelines equal one process, and tokens/s counts each batch's own tokens.
TEST(VariableLengths, EachBatchHasItsOwnLengthAndPipelinesEqualOneProcess) {
  ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common = model_args(model) +
                             " --seq-len-range 5:16 --batch-size 8 --microbatches 4 --steps 6 "
                             "--quiet";
  run_reference(common + " --pp 1 --schedule 1f1b", dir);
  for (const auto& [pp, schedule] :
       {std::pair<int, std::string>{2, "1f1b"}, {4, "zb-v"}, {2, "interleaved-1f1b"}}) {
    SCOPED_TRACE("--pp " + std::to_string(pp) + " --schedule " + schedule);
    expect_run_matches_reference(model,
                                 common + " --pp " + std::to_string(pp) + " --schedule " + schedule,
                                 "pp" + std::to_string(pp) + schedule, dir);
  }
  // Tokens per sample = tokens/s over samples/s: the lengths drawn, which differ.
  const auto tokens = read_field(dir / "ref.jsonl", "tokens_per_s");
  const auto samples = read_field(dir / "ref.jsonl", "samples_per_s");
  std::set<long> lengths;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const long length = std::lround(tokens[k] / samples[k]);
    EXPECT_GE(length, 5);
    EXPECT_LE(length, 16);
    lengths.insert(length);
  }
  EXPECT_GE(lengths.size(), 3u);
}

// --tie-embeddings: the head's weight is a copy of the token table, kept equal by summing the
// two copies' gradients; pipelines (the copies on two ranks, or on one rank with zb-v) equal one
// process, where both copies sit in one stage, and the saved copies are equal bit for bit.
TEST(TiedEmbeddings, PipelinesEqualOneProcessAndTheCopiesStayEqual) {
  ModelOptions model = small_model("gpt");
  model.tie_embeddings = true;
  TempDir dir;
  const std::string common =
      model_args(model) + " --tie-embeddings --batch-size 8 --microbatches 4 --steps 5 --quiet";
  run_reference(common + " --pp 1 --schedule 1f1b", dir);
  for (const std::string flags :
       {"--pp 2 --schedule 1f1b", "--pp 4 --schedule zb-v", "--pp 2 --dp 2 --schedule zb-h1"}) {
    SCOPED_TRACE(flags);
    std::string tag = flags;
    for (char& c : tag) c = c == ' ' ? '_' : c;
    expect_run_matches_reference(model, common + " " + flags, tag, dir);
    expect_table_stored_once(model, dir / tag, "sgd");
  }
}

// --model unet: each encoder layer's states go to the mirrored decoder layer; where the two are
// on different stages, straight across as a skip connection past the stages between (or handed
// over on one rank, zb-v). Pipelines equal one process, in which they ride along the layers.
TEST(Unet, SkipConnectionsAcrossStagesEqualOneProcess) {
  const ModelOptions model = small_model("unet");
  TempDir dir;
  const std::string common =
      model_args(model) + " --batch-size 8 --microbatches 4 --steps 5 --quiet";
  run_reference(common + " --pp 1 --schedule 1f1b", dir);
  expect_runs_match_reference(
      model, common,
      {"--pp 2 --schedule 1f1b", "--pp 4 --schedule zb-v",
       "--pp 4 --schedule interleaved-1f1b --recompute", "--pp 2 --dp 2 --schedule zb-h1"},
      dir);
  expect_one_line_error(
      run_train("--model unet --layers 7 --pp 2 --schedule 1f1b --microbatches 2 --batch-size 4 "
                "--steps 1",
                dir),
      "--model unet needs an even number of --layers (down and up blocks), got 7");
  expect_one_line_error(run_train("--model unet --layers 4 --pp 2 --schedule pipedream "
                                  "--microbatches 4 --batch-size 8 --steps 1",
                                  dir),
                        "--model unet: pipedream is asynchronous");
}

// A schedule is data: one written by hand (fused and split backwards mixed, W's late and out of
// order) and one exported with its communication by `pptrain schedule` train like --pp 1.
TEST(MatchesReferenceScheduleFile, HandWrittenAndExportedSchedules) {
  const ModelOptions model = small_model("mlp");
  TempDir dir;
  const std::string common =
      model_args(model) + " --batch-size 8 --microbatches 4 --steps 5 --quiet";
  ASSERT_EQ(run_train(common + " --pp 1 --schedule 1f1b --metrics " + (dir / "ref.jsonl").string() +
                          " --save " + (dir / "ref").string(),
                      dir)
                .exit_code,
            0);
  {
    std::ofstream csv(dir / "hand.csv");
    csv << "0F0,0F1,0F2,0I0,0F3,0I1,0I2,0W1,0W0,0B3,0W2\n"
           "1F0,1B0,1F1,1I1,1F2,1B2,1W1,1F3,1I3,1W3\n";
  }
  const auto exported =
      run_pptrain("schedule --schedule zb-h2 --pp 4 --microbatches 4 --with-comms --export " +
                      (dir / "zb-h2.csv").string(),
                  dir);
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  for (const auto& [file, pp] : {std::pair<std::string, int>{"hand.csv", 2}, {"zb-h2.csv", 4}}) {
    SCOPED_TRACE(file);
    const auto run =
        run_train(common + " --pp " + std::to_string(pp) + " --schedule-file " +
                      (dir / file).string() + " --metrics " + (dir / (file + ".jsonl")).string() +
                      " --save " + (dir / (file + ".params")).string(),
                  dir);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto want = read_losses(dir / "ref.jsonl"), got = read_losses(dir / (file + ".jsonl"));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]));
    expect_same_parameters(model, dir / (file + ".params"), dir / "ref");
  }
}

// AdamW normalises each gradient, so it also checks the small ones; one schedule is enough.
TEST(MatchesReferenceAdamW, ZbVOnTwoRanks) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common = model_args(model) +
                             " --batch-size 8 --microbatches 4 --steps 5 --quiet --optimizer adamw "
                             "--schedule zb-v";
  ASSERT_EQ(run_train(common + " --pp 1 --metrics " + (dir / "ref.jsonl").string() + " --save " +
                          (dir / "ref").string(),
                      dir)
                .exit_code,
            0);
  const auto run = run_train(common + " --pp 2 --metrics " + (dir / "run.jsonl").string() +
                                 " --save " + (dir / "run").string(),
                             dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto want = read_losses(dir / "ref.jsonl"), got = read_losses(dir / "run.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]));
  expect_same_parameters(model, dir / "run", dir / "ref");
}

// The warm-up and the momentum reach every stage's optimizer: 1F1B on 2 ranks still equals one
// process, and its losses leave those of a run without them from step 2 (step 1's forward comes
// before any update).
TEST(MatchesReferenceWarmupMomentum, OneFOneBOnTwoRanks) {
  const ModelOptions model = small_model("gpt");
  TempDir dir;
  const std::string common =
      model_args(model) + " --batch-size 8 --microbatches 4 --steps 4 --quiet --schedule 1f1b";
  const std::string extra = " --warmup-steps 3 --momentum 0.5";
  for (const std::string name : {"plain", "ref", "run"}) {
    const std::string flags = name == "plain" ? " --pp 1"
                              : name == "ref" ? " --pp 1" + extra
                                              : " --pp 2" + extra;
    const auto out =
        run_train(common + flags + " --metrics " + (dir / (name + ".jsonl")).string(), dir);
    ASSERT_EQ(out.exit_code, 0) << out.err;
  }
  const auto plain = read_losses(dir / "plain.jsonl"), want = read_losses(dir / "ref.jsonl"),
             got = read_losses(dir / "run.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]));
  EXPECT_EQ(plain[0], want[0]);
  EXPECT_GT(std::abs(plain[1] - want[1]), 1e-4 * std::abs(want[1]));
}

// The metrics file has one line per step with every field, a bubble in [0, 1) and a memory
// figure per rank; --trace and --svg write the last step.
TEST(Outputs, MetricsTraceSvgAndLoad) {
  TempDir dir;
  const std::string common = model_args(small_model("gpt")) +
                             " --pp 2 --schedule 1f1b --batch-size 8 --microbatches 4 --quiet";
  const auto run = run_train(common + " --steps 3 --metrics " + (dir / "m.jsonl").string() +
                                 " --trace " + (dir / "t.json").string() + " --svg " +
                                 (dir / "t.svg").string() + " --save " + (dir / "ckpt").string(),
                             dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream in(dir / "m.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    ++lines;
    EXPECT_EQ(j.at("step").get<int>(), lines);
    for (const char* key :
         {"loss", "step_time_s", "samples_per_s", "tokens_per_s", "bubble_ratio"}) {
      EXPECT_TRUE(j.at(key).is_number()) << key;
    }
    EXPECT_GE(j["bubble_ratio"].get<double>(), 0.0);
    EXPECT_LT(j["bubble_ratio"].get<double>(), 1.0);
    EXPECT_GT(j["step_time_s"].get<double>(), 0.0);
    ASSERT_EQ(j.at("peak_activation_bytes").size(), 2u);
    for (const auto& bytes : j["peak_activation_bytes"]) EXPECT_GT(bytes.get<int64_t>(), 0);
  }
  EXPECT_EQ(lines, 3);
  const auto trace = nlohmann::json::parse(read_text(dir / "t.json"));
  EXPECT_FALSE(trace.at("traceEvents").empty());
  EXPECT_NE(read_text(dir / "t.svg").find("<svg"), std::string::npos);

  // Training on from the checkpoint with another split starts where the first run ended: its
  // first loss is below the first run's first loss.
  const auto resumed =
      run_train(model_args(small_model("gpt")) +
                    " --pp 1 --batch-size 8 --microbatches 4 --quiet --steps 1 --metrics " +
                    (dir / "r.jsonl").string() + " --load " + (dir / "ckpt").string(),
                dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto first = read_losses(dir / "m.jsonl"), again = read_losses(dir / "r.jsonl");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_LT(again[0], first[0]);
}

// The cost columns of the metrics: bytes sent, weight bytes, compute seconds, peak memory, per
// rank.
TEST(Outputs, MetricsCountBytesSentWeightsAndCompute) {
  TempDir dir;
  const std::string common =
      model_args(small_model("mlp")) + " --pp 2 --batch-size 16 --microbatches 4 --steps 2 --quiet";
  const auto run = [&](const std::string& flags, const std::string& tag) {
    const auto result =
        run_train(common + " " + flags + " --metrics " + (dir / (tag + ".jsonl")).string(), dir);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return last_metrics_line(dir / (tag + ".jsonl"));
  };
  const auto plain = run("--schedule 1f1b", "plain");
  const auto sent = plain.at("bytes_sent").get<std::vector<int64_t>>();
  const auto weights = plain.at("weight_bytes").get<std::vector<int64_t>>();
  ASSERT_EQ(sent.size(), 2u);
  // An mlp's activation and its gradient have one shape: as many bytes go down as come back.
  EXPECT_GT(sent[0], 0);
  EXPECT_EQ(sent[0], sent[1]);
  for (double seconds : plain.at("compute_s").get<std::vector<double>>()) {
    EXPECT_GT(seconds, 0);
    EXPECT_LE(seconds, plain.at("step_time_s").get<double>());
  }
  // The peak of what a rank holds: its weights, their gradients and sgd's momentum, which
  // persist from the first step on, and on top of them the step's activations. The peak sees
  // more (the batch, messages), but not much more for this small model.
  const auto expect_peak_holds = [](const nlohmann::json& line, int rank, int64_t persistent) {
    const auto peak = line.at("peak_memory_bytes").at(rank).get<int64_t>();
    const auto activations = line.at("peak_activation_bytes").at(rank).get<int64_t>();
    EXPECT_GE(peak, persistent + activations) << "rank " << rank;
    EXPECT_LE(peak, 2 * (persistent + activations)) << "rank " << rank;
  };
  const auto state = plain.at("optimizer_state_bytes").get<std::vector<int64_t>>();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(state[r], weights[r]) << "rank " << r;  // sgd: one momentum per parameter
    expect_peak_holds(plain, r, 3 * weights[r]);
  }
  // PipeDream stashes 2 versions on stage 0 of 2, 1 on stage 1.
  const auto pipedream = run("--schedule pipedream", "stashed");
  const auto stashed = pipedream.at("weight_bytes");
  EXPECT_EQ(stashed.at(0).get<int64_t>(), 2 * weights[0]);
  EXPECT_EQ(stashed.at(1).get<int64_t>(), weights[1]);
  for (int r = 0; r < 2; ++r) expect_peak_holds(pipedream, r, (r == 0 ? 4 : 3) * weights[r]);
  // Two copies: half the microbatch each, and a ring all-reduce of every stage's gradients,
  // 2 (D-1) / D x its bytes = its bytes at D = 2.
  const auto copies = run("--schedule 1f1b --dp 2", "copies");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(copies.at("bytes_sent").at(r).get<int64_t>(), sent[r % 2] / 2 + weights[r % 2])
        << "rank " << r;
  }
  // avgpipe keeps a centre beside each copy's weights.
  const auto averaged = run("--schedule avgpipe --dp 2", "averaged");
  EXPECT_EQ(averaged.at("weight_bytes").at(0).get<int64_t>(), 2 * weights[0]);
}

TEST(Supervision, CrashedWorkerStopsTheRun) {
  TempDir dir;
  const auto run =
      run_train(model_args(small_model("gpt")) +
                    " --pp 2 --schedule 1f1b --batch-size 8 --microbatches 4 --steps 1000",
                dir, "PPTRAIN_TEST_CRASH_RANK=1 PPTRAIN_TEST_CRASH_STEP=2 ");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_LT(run.seconds, 30.0);
  // The first error line names the cause, not rank 0's view of it; it is the only one.
  EXPECT_EQ(run.err.rfind("pptrain: error: worker rank 1 was killed by signal 6", 0), 0u)
      << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  // A peer that saw the connection break does not blame a timeout.
  EXPECT_EQ(run.err.find("timed out"), std::string::npos) << run.err;
  // The run got going before the crash: rank 0 printed steps 1 and 2.
  EXPECT_NE(run.out.find("step 2/1000"), std::string::npos) << run.out;
}

// Started by hand (RANK set) while its peer never comes: a one-line error within the
// communication timeout, not a hang and not a backtrace.
TEST(Supervision, MissingPeerIsAOneLineErrorNotAHang) {
  TempDir dir;
  const std::string env = "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(find_free_port()) + " PPTRAIN_COMM_TIMEOUT_S=3 ";
  const auto run =
      run_train(model_args(small_model("mlp")) +
                    " --pp 2 --schedule 1f1b --batch-size 8 --microbatches 4 --steps 2",
                dir, env);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_LT(run.seconds, 30.0);
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find("pptrain: error: rank 0 of 2 could not join the rendezvous"),
            std::string::npos)
      << run.err;
  // It says how long it really waited: at least one stage's timeout, and not more than the run
  // lasted (whole seconds, so up to one above it). Not compared closer: the run's time also has
  // LibTorch's start, seconds on a loaded machine (it was 2.1 s once beside a full ctest -j2).
  const auto after = run.err.find("gave up after ");
  ASSERT_NE(after, std::string::npos) << run.err;
  const int stated = std::atoi(run.err.c_str() + after + 14);
  EXPECT_GE(stated, 3) << run.err;
  EXPECT_LE(stated, run.seconds + 1) << run.err;
}

// What the other of two ranks started by hand did after one was stopped (SIGSTOP).
struct StoppedPeerRun {
  int exit_code = -1;  // the other rank's
  std::string err;     // its stderr
  int seconds = -1;    // from the stop to its exit
};

// Starts `pptrain train <args>` as rank 0 (with `rank0_args` added) and rank 1 on a free port,
// with the environment assignments `env`; stops rank `stopped` once the shell test `ready`
// holds, and waits for the other.
StoppedPeerRun stop_rank_when(const TempDir& dir, const std::string& env, const std::string& args,
                              const std::string& rank0_args, const std::string& ready,
                              int stopped) {
  const std::string all_env = "LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                              std::to_string(find_free_port()) + " " + env;
  // "RANK=r <env> [exec ]pptrain train <args>"
  const auto command = [&](int rank, const std::string& exec) {
    return "RANK=" + std::to_string(rank) + " " + all_env + exec + PPTRAIN_BINARY + " train " +
           args + (rank == 0 ? rank0_args : "");
  };
  const std::string script =
      command(stopped, "exec ") + " >/dev/null 2>/dev/null & one=$!; (" + command(1 - stopped, "") +
      " >/dev/null 2>" + (dir / "err").string() + "; echo $? >" + (dir / "rc").string() +
      ") & zero=$!; for i in $(seq 600); do " + ready + " && break; sleep 0.1; done; sleep 1; " +
      "kill -STOP $one; start=$SECONDS; wait $zero; echo $((SECONDS - start)) >" +
      (dir / "took").string() + "; kill -KILL $one; kill -CONT $one; wait $one; true";
  std::ofstream(dir / "run.sh") << script << "\n";
  StoppedPeerRun run;
  if (std::system(("bash " + (dir / "run.sh").string()).c_str()) != 0) return run;
  run.exit_code = std::stoi(read_text(dir / "rc"));
  run.err = read_text(dir / "err");
  run.seconds = std::stoi(read_text(dir / "took"));
  return run;
}

// Ranks started by hand (no launcher to watch them) when one is stopped (SIGSTOP) mid-run: the
// other stops within --comm-timeout, naming the rank and the operation it waited for.
TEST(Supervision, StoppedPeerStartedByHandIsNamed) {
  TempDir dir;
  const std::string metrics = (dir / "m.jsonl").string();
  const auto run = stop_rank_when(
      dir, "",
      model_args(small_model("mlp")) +
          " --pp 2 --batch-size 8 --microbatches 4 --steps 100000 --quiet --comm-timeout 4",
      " --metrics " + metrics, "[ -s " + metrics + " ]", 1);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_LE(run.seconds, 30) << run.err;
  EXPECT_EQ(run.err.rfind("pptrain: error: rank 0: ", 0), 0u) << run.err;
  // The receive's deadline or the heartbeat, whichever comes first.
  EXPECT_TRUE(run.err.find("rank 1: no answer within 4 s (--comm-timeout") != std::string::npos ||
              run.err.find("rank 1 has not answered for 4 s (stopped or hung)") !=
                  std::string::npos)
      << run.err;
  // A receive that timed out names the rank whose heartbeat went silent as well.
  if (run.err.find("no answer within") != std::string::npos) {
    EXPECT_NE(run.err.find("; rank 1 has not answered for "), std::string::npos) << run.err;
    EXPECT_NE(run.err.find(" s (stopped, hung or unreachable)\n"), std::string::npos) << run.err;
  }
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
}

// The same when the other rank is not waiting on the stopped one: both ranks are in a long pause
// of a save (PPTRAIN_TEST_SAVE_PAUSE_MS, 45 s, after writing their layers) when one is stopped.
// The other's heartbeat names it within the communication timeout, long before it would next
// wait on it. Rank 0 serves the store the heartbeats meet in; its silence is timed apart.
TEST(Supervision, StoppedPeerNobodyWaitsOnIsNamedByTheHeartbeat) {
  for (const int stopped : {1, 0}) {
    SCOPED_TRACE("rank " + std::to_string(stopped) + " stopped");
    TempDir dir;
    const std::string ckpt = (dir / "ckpt").string();
    const auto run = stop_rank_when(dir, "PPTRAIN_TEST_SAVE_PAUSE_MS=45000 ",
                                    model_args(small_model("mlp")) +
                                        " --pp 2 --batch-size 8 --microbatches 4 --steps 1 "
                                        "--quiet --comm-timeout 4 --save " +
                                        ckpt,
                                    "", "[ -d " + ckpt + ".partial ]", stopped);
    const int other = 1 - stopped;
    EXPECT_EQ(run.exit_code, 1) << run.err;
    EXPECT_LE(run.seconds, 30) << run.err;
    // One line naming the stopped rank; the seconds are measured (the comm timeout or a little
    // more, as the watchdog of a stopped rank 0 counts whole rounds).
    const std::string head = "pptrain: error: rank " + std::to_string(other) + ": rank " +
                             std::to_string(stopped) + " has not answered for ";
    EXPECT_EQ(run.err.rfind(head, 0), 0u) << run.err;
    const int said = std::atoi(run.err.c_str() + std::min(run.err.size(), head.size()));
    EXPECT_GE(said, 4) << run.err;
    EXPECT_LE(said, 8) << run.err;
    EXPECT_NE(run.err.find(" s (stopped or hung)\n"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
}

// A loss that blows up (--lr 1e30) stops the run with exit status 1 naming the step, on one
// process and on two; --skip-nonfinite trains on, skipping those steps.
TEST(NonFinite, StopsTheRunNamingTheStepUnlessSkipped) {
  for (const std::string pp : {"1", "2"}) {
    TempDir dir;
    const std::string args = model_args(small_model("mlp")) + " --pp " + pp +
                             " --schedule 1f1b --batch-size 8 --microbatches 4 --steps 4 "
                             "--lr 1e30 --clip 0 --quiet --metrics " +
                             (dir / "m.jsonl").string();
    const auto stopped = run_train(args, dir);
    EXPECT_EQ(stopped.exit_code, 1) << stopped.err;
    EXPECT_NE(stopped.err.find("the gradient norm is "), std::string::npos) << stopped.err;
    EXPECT_NE(stopped.err.find("stopped before the optimizer step"), std::string::npos)
        << stopped.err;
    const auto skipped = run_train(args + " --skip-nonfinite", dir);
    EXPECT_EQ(skipped.exit_code, 0) << skipped.err;
    // JSON has no NaN: a non-finite loss is written as null.
    const std::string metrics = read_text(dir / "m.jsonl");
    EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 4) << metrics;
  }
}

// Two ranks started by hand (torchrun style) whose flags differ in one setting: both stop at
// once with exit status 2 and a line naming the flag, instead of crashing in Gloo, hanging until
// the communication timeout, or training silently wrong.
struct Disagreement {
  std::string name;
  std::string rank1_flags;  // replaces the default for rank 1 only
  std::string expected;
  std::string layout = "--pp 2 --microbatches 4";  // both ranks'
};

void PrintTo(const Disagreement& d, std::ostream* out) {
  *out << d.name;
}

class RanksDisagree : public ::testing::TestWithParam<Disagreement> {};

TEST_P(RanksDisagree, BothRanksStopNamingTheFlag) {
  TempDir dir;
  const std::string common = "train --model gpt --layers 4 --heads 4 --seq-len 16 " +
                             GetParam().layout + " --batch-size 8 --steps 2 --quiet ";
  const std::string rank0 = common + "--d-model 32 --seed 1 --schedule 1f1b";
  std::string rank1 = common + GetParam().rank1_flags;
  const std::string env = "LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(find_free_port()) + " PPTRAIN_COMM_TIMEOUT_S=60 ";
  // Both ranks at once; each one's exit status and stderr in its own files.
  const auto side = [&](int rank, const std::string& args) {
    const std::string r = std::to_string(rank);
    return "(RANK=" + r + " " + env + PPTRAIN_BINARY + " " + args + " >/dev/null 2>" +
           (dir / ("err" + r)).string() + "; echo $? >" + (dir / ("rc" + r)).string() + ")";
  };
  const auto start = std::chrono::steady_clock::now();
  const std::string both = side(0, rank0) + " & " + side(1, rank1) + " & wait";
  ASSERT_EQ(std::system(("bash -c '" + both + "'").c_str()), 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  for (int rank : {0, 1}) {
    const std::string err = read_text(dir / ("err" + std::to_string(rank)));
    EXPECT_EQ(std::stoi(read_text(dir / ("rc" + std::to_string(rank)))), 2) << err;
    EXPECT_EQ(err.rfind("pptrain: error: rank " + std::to_string(rank) + ": ranks disagree on " +
                            GetParam().expected,
                        0),
              0u)
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Flags, RanksDisagree,
    ::testing::Values(Disagreement{"DModel", "--d-model 64 --seed 1 --schedule 1f1b",
                                   "--d-model: rank 0 has 32, rank 1 has 64"},
                      Disagreement{"Seed", "--d-model 32 --seed 2 --schedule 1f1b",
                                   "--seed: rank 0 has 1, rank 1 has 2"},
                      Disagreement{"Schedule", "--d-model 32 --seed 1 --schedule zb-h1",
                                   "--schedule: rank 0 has 1f1b, rank 1 has zb-h1"},
                      Disagreement{"Precision",
                                   "--d-model 32 --seed 1 --schedule 1f1b --precision bf16",
                                   "--precision: rank 0 has fp32, rank 1 has bf16"},
                      Disagreement{"DataParallelShares",
                                   "--d-model 32 --seed 1 --schedule 1f1b --dp-shares 6,2",
                                   "--dp-shares: rank 0 has (equal), rank 1 has 6,2",
                                   "--pp 1 --dp 2 --microbatches 2"}),
    [](const ::testing::TestParamInfo<Disagreement>& info) { return info.param.name; });

// Bad input: exit status 2, one line on stderr naming the problem, no worker started.
struct BadInput {
  std::string name;
  std::string args;
  std::string expected;  // part of the message
};

// Test names show the case's name, not its bytes.
void PrintTo(const BadInput& input, std::ostream* out) {
  *out << input.name;
}

class RejectsBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(RejectsBadInput, OneLineAndExitStatus2) {
  TempDir dir;
  std::ofstream(dir / "two_ranks.csv") << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  std::ofstream(dir / "broken.csv") << "0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n";
  std::string args = GetParam().args;
  const std::string placeholder = "DIR/";
  for (size_t at; (at = args.find(placeholder)) != std::string::npos;) {
    args.replace(at, placeholder.size(), (dir / "").string());
  }
  const auto run = run_train(
      "--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --steps 2 " + args, dir);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(run.err.rfind("pptrain: error: ", 0), 0u) << run.err;
  // One line; an invalid schedule follows it with its grid, whose every row starts "rank ".
  std::istringstream lines(run.err);
  int message_lines = 0;
  for (std::string line; std::getline(lines, line);) message_lines += line.rfind("rank ", 0) != 0;
  EXPECT_EQ(message_lines, 1) << run.err;
  EXPECT_NE(run.err.substr(0, run.err.find('\n')).find(GetParam().expected), std::string::npos)
      << run.err;
  EXPECT_EQ(run.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RejectsBadInput,
    ::testing::Values(
        BadInput{"MoreRanksThanBlocks", "--pp 5 --schedule 1f1b --microbatches 4 --batch-size 8",
                 "--pp 5 is larger than the model's 4 blocks"},
        BadInput{"TooManyStages",
                 "--pp 4 --schedule interleaved-1f1b --microbatches 4 --batch-size 8",
                 "has 8 stages"},
        BadInput{"NoMicrobatches", "--pp 2 --schedule 1f1b --microbatches 0 --batch-size 8",
                 "--microbatches must be >= 1, got 0"},
        BadInput{"BatchNotDivisible", "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 6",
                 "--batch-size 6 is not a positive multiple of --microbatches 4"},
        BadInput{"UnknownSchedule", "--pp 2 --schedule 2f2b --microbatches 4 --batch-size 8",
                 "unknown schedule '2f2b'"},
        BadInput{"UnreadableData",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --data DIR/missing.txt",
                 "missing.txt"},
        BadInput{"ScheduleFileForOtherP",
                 "--pp 4 --schedule-file DIR/two_ranks.csv --microbatches 2 --batch-size 8",
                 "--pp 4 does not match"},
        BadInput{"InvalidScheduleFile",
                 "--pp 2 --schedule-file DIR/broken.csv --microbatches 2 --batch-size 8",
                 "is not valid: rank 0, position 1 (0B1)"},
        BadInput{"ChunksTheScheduleCannotUse",
                 "--pp 2 --schedule 1f1b --chunks 2 --microbatches 4 --batch-size 8", "chunks=2"},
        BadInput{"UnknownOptimizer",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --optimizer lion",
                 "--optimizer must be sgd or adamw, got 'lion'"},
        BadInput{"PostValidationWithAnAsynchronousSchedule",
                 "--pp 2 --schedule pipedream --microbatches 4 --batch-size 8 --post-validation",
                 "--post-validation: pipedream is asynchronous"},
        BadInput{"ExactRollbackWithoutPostValidation",
                 "--pp 2 --schedule zb-h1 --microbatches 4 --batch-size 8 --exact-rollback",
                 "--exact-rollback applies to --post-validation only"},
        BadInput{"SaveWorkersWithoutWorkers",
                 "--pp 2 --microbatches 4 --batch-size 8 --save-workers DIR/w.json",
                 "--save-workers writes what --partition workers measures"},
        BadInput{"ReplanUnknown", "--pp 2 --microbatches 4 --batch-size 8 --replan sometimes",
                 "--replan must be off or auto, got 'sometimes'"},
        BadInput{"ReplanWithDataParallelism",
                 "--pp 2 --dp 2 --microbatches 2 --batch-size 8 --replan auto",
                 "--replan auto moves layers between the ranks of one pipeline of one stage each"},
        BadInput{"ReplanAsynchronous",
                 "--pp 2 --schedule pipedream --microbatches 4 --batch-size 8 --replan auto",
                 "--replan auto moves layers between the ranks of one pipeline of one stage each"},
        BadInput{"TimeLimitWithoutTheIlp",
                 "--pp 2 --schedule zb-auto --microbatches 4 --batch-size 8 --time-limit 5",
                 "--time-limit applies to --solver ilp only"},
        BadInput{"UnknownWeightSplit",
                 "--pp 2 --schedule zb-h1 --microbatches 4 --batch-size 8 --weight-split half",
                 "--weight-split must be deferred or autograd, got 'half'"},
        BadInput{"AutogradWeightSplitWithAnAsynchronousSchedule",
                 "--pp 2 --schedule pipedream --microbatches 4 --batch-size 8 --weight-split "
                 "autograd",
                 "--weight-split autograd is for synchronous schedules"},
        BadInput{"VerticalSyncWithASyncSchedule",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --vertical-sync",
                 "--vertical-sync applies to --schedule pipedream only, not '1f1b'"},
        BadInput{"TwoBWWithTooFewMicrobatches",
                 "--pp 4 --schedule 2bw --microbatches 2 --batch-size 8",
                 "2bw on 4 stages needs --microbatches >= 3"},
        BadInput{"PipeMareFlagWithAnotherSchedule",
                 "--pp 2 --schedule 2bw --microbatches 4 --batch-size 8 --no-lr-reschedule",
                 "--no-lr-reschedule applies to --schedule pipemare only, not '2bw'"},
        BadInput{"PipeMareDecayOutOfRange",
                 "--pp 2 --schedule pipemare --microbatches 4 --batch-size 8 --pipemare-decay 1",
                 "--pipemare-decay must be in [0, 1), got 1"},
        BadInput{"UpdateIntervalWithAnotherSchedule",
                 "--pp 2 --schedule pipemare --microbatches 4 --batch-size 8 --update-interval 2",
                 "--update-interval applies to --schedule ampnet only, not 'pipemare'"},
        BadInput{"UpdateIntervalZero",
                 "--pp 2 --schedule ampnet --microbatches 4 --batch-size 8 --update-interval 0",
                 "--update-interval must be >= 1, got 0"},
        BadInput{"PredictionWithoutMomentum",
                 "--pp 2 --schedule spectrain --microbatches 4 --batch-size 8 --momentum 0",
                 "--schedule spectrain predicts weights along the optimizer's smoothed direction"},
        BadInput{"MomentumWithAdamW",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --optimizer adamw "
                 "--momentum 0.5",
                 "--momentum is sgd's; --optimizer adamw has none"},
        BadInput{"NegativeWarmup",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --warmup-steps -1",
                 "--warmup-steps must be >= 0, got -1"},
        BadInput{"DataIsAFolder", "--pp 1 --microbatches 2 --batch-size 8 --data DIR/",
                 "--data: cannot read text file"},
        BadInput{"MetricsIsAFolder", "--pp 1 --microbatches 2 --batch-size 8 --metrics DIR/",
                 "is a folder; give a file name"},
        BadInput{"ScheduleFileIsAFolder",
                 "--pp 2 --microbatches 2 --batch-size 8 --schedule-file DIR/",
                 "it is a folder, not a file"},
        BadInput{"SeqLenRangeBackwards",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --seq-len-range 9:4",
                 "--seq-len-range '9:4' is not MIN:MAX with whole numbers 1 <= MIN <= MAX"},
        BadInput{"SeqLenRangeAgainstSeqLen",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --seq-len-range 4:8",
                 "--seq-len 16 and --seq-len-range 4:8 disagree"},
        BadInput{"TiedEmbeddingsWithPipeMare",
                 "--pp 2 --schedule pipemare --microbatches 4 --batch-size 8 --tie-embeddings",
                 "--tie-embeddings: pipemare has no rule for tied parameters"},
        BadInput{"TiedEmbeddingsSavedMidwayUnderPipeDream",
                 "--pp 2 --schedule pipedream --microbatches 4 --batch-size 8 --tie-embeddings "
                 "--save DIR/c --save-every 2",
                 "--save-every: pipedream with --tie-embeddings saves only after the run's last "
                 "step"},
        BadInput{"MaxRestartsWithoutSave",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --max-restarts 2",
                 "--max-restarts needs --save DIR"},
        BadInput{"MaxRestartsNegative",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --max-restarts -1 "
                 "--save DIR/c",
                 "--max-restarts must be >= 0, got -1"},
        BadInput{"ResumeAutoWithLoad",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --resume auto --load "
                 "DIR/c --save DIR/c",
                 "give --load (parameters only, from step 0) or --resume"},
        BadInput{"ResumeAutoWithoutSave",
                 "--pp 2 --schedule 1f1b --microbatches 4 --batch-size 8 --resume auto",
                 "--resume auto needs --save DIR"},
        BadInput{"StagesWithSeveralRanks",
                 "--pp 2 --stages 4 --schedule pipedream --microbatches 4 --batch-size 8",
                 "--stages is for --pp 1"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

}  // namespace
}  // namespace pptrain
