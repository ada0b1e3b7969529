// Helpers of the end-to-end tests: run the real pptrain binary (PPTRAIN_BINARY) in a scratch
// folder, read what it wrote, and compare a pipelined run with the single-process reference.
//
//   TempDir dir;
//   RunResult run = run_pptrain("train --model gpt ... --metrics " + (dir / "m.jsonl").string(),
//   dir); ASSERT_EQ(run.exit_code, 0) << run.err; expect_same_losses(read_losses(dir / "m.jsonl"),
//   read_losses(dir / "ref.jsonl"));
//
// Parameters compare per tensor as max|a - b| / max(max|b|, 1e-12) <= 1e-5, losses to 1e-5
// relative: a pipelined run computes the same sums as --pp 1, in a different order.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/models/model.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/train/optimizer.h"

namespace pptrain::e2e {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A fresh folder per test case, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pptrain_e2e_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// Runs `pptrain <args>` with extra environment assignments ("A=1 B=2 "), capturing its output
// in `dir`.
inline RunResult run_pptrain(const std::string& args, const TempDir& dir,
                             const std::string& env = "") {
  const auto out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string command =
      env + PPTRAIN_BINARY + std::string(" ") + args + " > " + out.string() + " 2> " + err.string();
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  RunResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_text(out);
  result.err = read_text(err);
  return result;
}

// A test parameter of two strings ("gpt", "zb-v") as a GoogleTest name: "gpt_zb_v".
template <typename Pair>
std::string pair_test_name(const ::testing::TestParamInfo<Pair>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

inline RunResult run_train(const std::string& args, const TempDir& dir,
                           const std::string& env = "") {
  return run_pptrain("train " + args, dir, env);
}

// The "loss" of every line of a --metrics file.
// One numeric field of every line of a --metrics file.
inline std::vector<double> read_field(const fs::path& metrics, const std::string& field) {
  std::vector<double> values;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    values.push_back(nlohmann::json::parse(line).at(field).get<double>());
  }
  return values;
}

inline std::vector<double> read_losses(const fs::path& metrics) {
  return read_field(metrics, "loss");
}

// The last line of a --metrics file.
inline nlohmann::json last_metrics_line(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return nlohmann::json::parse(last);
}

inline ModelOptions small_model(const std::string& kind) {
  ModelOptions model;
  model.kind = kind;
  model.layers = 8;  // enough blocks for 4 ranks x 2 chunks
  model.d_model = 32;
  model.heads = 4;
  model.seq_len = 16;
  return model;
}

inline std::string model_args(const ModelOptions& m) {
  return "--model " + m.kind + " --layers " + std::to_string(m.layers) + " --d-model " +
         std::to_string(m.d_model) + " --heads " + std::to_string(m.heads) + " --seq-len " +
         std::to_string(m.seq_len);
}

inline void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want,
                               double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i])) << "step " << i + 1;
  }
}

// The parameters a checkpoint of `model` stores elsewhere than in their layer's file: the head's
// copy of a tied token table (--tie-embeddings), stored once with layer 0's.
inline std::vector<std::string> stored_elsewhere(const ModelOptions& model, int layer) {
  if (!model.tie_embeddings || layer != num_layers(model) - 1) return {};
  return {"lm_head.weight"};
}

// Every layer's parameters in `dir` against `reference_dir` (both written by --save).
inline void expect_same_parameters(const ModelOptions& model, const fs::path& dir,
                                   const fs::path& reference_dir, double tolerance = 1e-5) {
  for (int layer = 0; layer < num_layers(model); ++layer) {
    auto got = make_layer(model, layer).ptr();
    auto want = make_layer(model, layer).ptr();
    load_layer(*got, layer_file(dir.string(), layer), stored_elsewhere(model, layer));
    load_layer(*want, layer_file(reference_dir.string(), layer), stored_elsewhere(model, layer));
    const auto got_params = got->named_parameters();
    const auto want_params = want->named_parameters();
    ASSERT_EQ(got_params.size(), want_params.size());
    for (const auto& item : want_params) {
      const torch::Tensor a = got_params[item.key()];
      const torch::Tensor b = item.value();
      const double scale = std::max(b.abs().max().item<double>(), 1e-12);
      const double rel = (a - b).abs().max().item<double>() / scale;
      EXPECT_LE(rel, tolerance) << "layer " << layer << " parameter " << item.key();
    }
  }
}

// A gpt checkpoint of --tie-embeddings stores the token table once: in layer 0's file, not in
// the head's; and its optimizer state (of `optimizer`, "sgd" with momentum or "adamw") too.
inline void expect_table_stored_once(ModelOptions model, const fs::path& dir,
                                     const std::string& optimizer) {
  model.tie_embeddings = true;
  const int last = num_layers(model) - 1;
  OptimizerOptions options;
  options.kind = optimizer;
  for (int layer : {0, last}) {
    Stage stage = make_stage(model, 0, {layer, layer});
    StageOptimizer state(options, stage);
    state.load(dir.string());
    const torch::Tensor table =
        stage.layers()[0].ptr()->named_parameters()[layer == 0 ? "token" : "lm_head.weight"];
    EXPECT_EQ(state.state_of(table).empty(), layer == last)
        << "layer " << layer << "'s optimizer file in " << dir.string();
  }
  auto embedding = make_layer(model, 0).ptr();
  auto head = make_layer(model, num_layers(model) - 1).ptr();
  load_layer(*embedding, layer_file(dir.string(), 0), {});
  try {
    load_layer(*head, layer_file(dir.string(), num_layers(model) - 1), {});
    ADD_FAILURE() << "the head's file in " << dir.string() << " holds the tied table too";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no 'lm_head.weight'"), std::string::npos) << e.what();
  }
}

// Runs `pptrain train <args>` (the --pp 1 reference) writing DIR/ref.jsonl and DIR/ref, which
// expect_run_matches_reference() compares with.
inline void run_reference(const std::string& args, const TempDir& dir) {
  const auto run = run_train(
      args + " --metrics " + (dir / "ref.jsonl").string() + " --save " + (dir / "ref").string(),
      dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
}

// Runs `pptrain train <args>` writing DIR/<tag>.jsonl and the checkpoint DIR/<tag>, and expects
// its losses and final parameters to equal the reference run's, DIR/ref.jsonl and DIR/ref.
inline void expect_run_matches_reference(const ModelOptions& model, const std::string& args,
                                         const std::string& tag, const TempDir& dir) {
  const auto run = run_train(
      args + " --metrics " + (dir / (tag + ".jsonl")).string() + " --save " + (dir / tag).string(),
      dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_same_losses(read_losses(dir / (tag + ".jsonl")), read_losses(dir / "ref.jsonl"));
  expect_same_parameters(model, dir / tag, dir / "ref");
}

// expect_run_matches_reference() of `common` followed by each of `variants`, each tagged by its
// own flags (spaces as '_') and traced by them.
inline void expect_runs_match_reference(const ModelOptions& model, const std::string& common,
                                        const std::vector<std::string>& variants,
                                        const TempDir& dir) {
  for (const std::string& flags : variants) {
    SCOPED_TRACE(flags);
    std::string tag = flags;
    for (char& c : tag) c = c == ' ' ? '_' : c;
    expect_run_matches_reference(model, common + " " + flags, tag, dir);
  }
}

// The ids of the running processes whose command line contains `text`.
inline std::vector<pid_t> processes_mentioning(const std::string& text) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_text(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(text) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// Bad input gets exit status 2 and one line on stderr, "pptrain: error: ...", containing
// `expected`, and nothing on stdout.
inline void expect_one_line_error(const RunResult& run, const std::string& expected) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(run.err.rfind("pptrain: error: ", 0), 0u) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(expected), std::string::npos)
      << "expected '" << expected << "' in " << run.err;
  EXPECT_EQ(run.out, "");
}

}  // namespace pptrain::e2e
