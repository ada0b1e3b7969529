#include "pptrain/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/runtime/archive_file.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/train/partition_plan.h"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "pptrain-checkpoint";
constexpr int kVersion = 2;  // 2: optimizer state, step and data position

fs::path manifest_path(const fs::path& dir) {
  return dir / "manifest.json";
}

// The model settings a checkpoint's shapes depend on, as the manifest records them.
nlohmann::ordered_json model_json(const ModelOptions& m) {
  nlohmann::ordered_json out;
  out["kind"] = m.kind;
  out["layers"] = m.layers;
  out["d_model"] = m.d_model;
  if (m.kind == "gpt") {
    out["heads"] = m.heads;
    out["seq_len"] = m.seq_len;
    out["vocab_size"] = m.vocab_size;
    if (m.tie_embeddings) out["tie_embeddings"] = true;
  }
  return out;
}

// The settings a resumed run must share with the run that saved it (a checkpoint's optimizer
// state and data position mean nothing under others), as the manifest records them.
nlohmann::ordered_json resume_json(const TrainingPlan& plan) {
  nlohmann::ordered_json out;
  out["optimizer"] = plan.optimizer.kind;
  if (plan.optimizer.kind == "sgd") out["momentum"] = plan.optimizer.momentum;
  out["data"] = plan.data.source;
  out["seed"] = plan.data.seed;
  out["batch_size"] = plan.data.batch_size;
  return out;
}

// What an asynchronous run's checkpoint shares with the run that continues it: the schedule is
// one list over the whole run, so the flags that shape the list must be the same.
nlohmann::ordered_json asynchronous_json(const TrainingPlan& plan) {
  nlohmann::ordered_json out;
  out["steps"] = plan.steps;
  out["schedule"] = plan.schedule->name;
  out["pp"] = plan.ranks();
  out["microbatches"] = plan.microbatches();
  out["stage_layers"] = format_stage_layers(plan.stage_layers);
  return out;
}

// The manifest of `plan`'s checkpoint after `steps_done` steps, without its list of files.
nlohmann::ordered_json manifest_of(const TrainingPlan& plan, int steps_done) {
  nlohmann::ordered_json out;
  out["format"] = kFormat;
  out["version"] = kVersion;
  out["model"] = model_json(plan.model);
  out["stage_layers"] = format_stage_layers(plan.stage_layers);
  out["schedule"] = plan.schedule->name;
  out["pp"] = plan.ranks();
  out["step"] = steps_done;
  out["resume"] = resume_json(plan);
  // What the run computed in; its parameters and optimizer state are float32 at every precision,
  // so a run at another precision continues them as they are (checkpoint_precision()).
  if (plan.precision != Precision::kFp32) out["precision"] = precision_name(plan.precision);
  if (plan.asynchronous()) out["asynchronous"] = asynchronous_json(plan);
  // The data of step k is drawn from a generator seeded with (seed, k): the next step's index is
  // the whole data position and random state.
  out["data_position"] = {{"next_step", steps_done}, {"rng", "per step, from (seed, step)"}};
  return out;
}

// `manifest` with the list of the files in `dir`: each one's size and checksum.
nlohmann::ordered_json with_files(nlohmann::ordered_json manifest, const fs::path& dir) {
  manifest["files"] = nlohmann::ordered_json::object();
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const std::string bytes = read_text_file(file.string(), "checkpoint file");
    manifest["files"][file.filename().string()] = {{"bytes", bytes.size()},
                                                   {"fnv1a64", digest(bytes)}};
  }
  return manifest;
}

// The manifest of `dir`; UserError (starting with `flag`) unless it is one of `format`, at
// `version`.
nlohmann::json read_manifest(const std::string& dir, const std::string& flag,
                             const std::string& format = kFormat, int version = kVersion) {
  const fs::path manifest = manifest_path(dir);
  PPTRAIN_CHECK(fs::is_directory(dir), flag, " '", dir, "' is not a folder");
  PPTRAIN_CHECK(fs::is_regular_file(manifest), flag, " '", dir,
                "' is not a whole checkpoint: it has no manifest.json (an interrupted save, or "
                "not a folder pptrain saved)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text_file(manifest.string(), "checkpoint manifest"));
  } catch (const nlohmann::json::exception&) {
    throw UserError(flag + " '" + dir + "': manifest.json is not valid JSON");
  }
  PPTRAIN_CHECK(m.is_object() && m.value("format", "") == format, flag, " '", dir,
                "': manifest.json is not a manifest of a ", format);
  PPTRAIN_CHECK(m.value("version", 0) == version, flag, " '", dir, "': ", format,
                " format version ", m.value("version", 0), ", this pptrain reads ", version);
  return m;
}

// UserError unless every field of `want` is in `have` with the same value: "checkpoint has
// d_model 64, flags say 128".
void expect_fields(const nlohmann::json& have, const nlohmann::json& want, const std::string& flag,
                   const std::string& dir) {
  for (const auto& [field, value] : want.items()) {
    const std::string has = have.contains(field) ? have[field].dump() : std::string("none");
    PPTRAIN_CHECK(have.contains(field) && have[field] == value, flag, " '", dir,
                  "': checkpoint has ", field, " ", has, ", flags say ", value.dump());
  }
}

// Puts `from` at `to` in one step, and what was at `to` (if anything) at `from`.
void swap_into_place(const fs::path& from, const fs::path& to) {
  if (!fs::exists(to)) {
    std::error_code error;
    fs::rename(from, to, error);
    PPTRAIN_CHECK(!error, "cannot move the new checkpoint to '", to.string(),
                  "': ", error.message());
    return;
  }
  const int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE);
  PPTRAIN_CHECK(rc == 0, "cannot swap the new checkpoint into '", to.string(),
                "': ", std::strerror(errno));
}

// A test hook: PPTRAIN_TEST_CRASH_SAVE=layers|manifest makes rank 0 abort once every layer, or
// also the manifest, is in DIR.partial, before the swap: the moments a kill can hit.
void maybe_crash_for_test(const char* moment) {
  const char* crash = std::getenv("PPTRAIN_TEST_CRASH_SAVE");
  if (crash && std::strcmp(crash, moment) == 0) std::abort();
}

// A test hook: PPTRAIN_TEST_SAVE_PAUSE_MS=N sleeps N ms after each stage's files and around the
// manifest and the swap, so that a test killing the run from outside can aim at each moment;
// PPTRAIN_TEST_SAVE_DELAY_MS=N sleeps before a save starts writing (a background save's copy is
// then written while later steps run).
void pause_for_test(const char* variable = "PPTRAIN_TEST_SAVE_PAUSE_MS") {
  const char* pause = std::getenv(variable);
  if (pause && *pause) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(pause)));
}

// The copies `--keep` left beside checkpoint folder `dir`, DIR.step-<k>: (k, folder), newest
// first.
std::vector<std::pair<int, fs::path>> kept_copies(const fs::path& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code error;
  const std::string prefix = dir.filename().string() + ".step-";
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  for (const auto& entry : fs::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    out.emplace_back(std::stoi(digits), entry.path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// The checkpoint a save replaced, now at `old`: removed, or with keep K > 1 renamed to
// DIR.step-<its step>, after which only the K - 1 newest of those stay.
void retire(const fs::path& old, const fs::path& dir, int keep) {
  std::error_code error;
  int step = -1;
  if (keep > 1) {
    try {
      step = nlohmann::json::parse(read_text_file(manifest_path(old).string(), "manifest"))
                 .value("step", -1);
    } catch (const std::exception&) {
      step = -1;  // an older format: not kept
    }
  }
  if (step < 0) {
    fs::remove_all(old, error);
    return;
  }
  const std::string prefix = dir.filename().string() + ".step-";
  const fs::path kept = dir.parent_path() / (prefix + std::to_string(step));
  fs::remove_all(kept, error);
  fs::rename(old, kept, error);
  if (error) fs::remove_all(old, error);
  std::vector<std::pair<int, fs::path>> older = kept_copies(dir);
  for (size_t i = static_cast<size_t>(keep - 1); i < older.size(); ++i) {
    fs::remove_all(older[i].second, error);
  }
}

}  // namespace

namespace {

// Of `save_dir` and the DIR.step-<k> copies --keep left beside it, newest first, the first that
// `check` accepts (returns without a UserError); "" when none does. `skipped` gets the error of
// each one passed over.
std::string newest_accepted(const std::string& save_dir,
                            const std::function<void(const std::string&)>& check,
                            std::vector<std::string>* skipped) {
  std::vector<fs::path> candidates;
  if (fs::exists(save_dir)) candidates.push_back(save_dir);
  for (const auto& [step, folder] : kept_copies(fs::path(save_dir))) candidates.push_back(folder);
  for (const fs::path& candidate : candidates) {
    try {
      check(candidate.string());
      return candidate.string();
    } catch (const UserError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return "";
}

}  // namespace

std::string newest_resumable(const std::string& save_dir, const TrainingPlan& plan,
                             std::vector<std::string>* skipped) {
  return newest_accepted(
      save_dir, [&plan](const std::string& dir) { check_resume(dir, plan); }, skipped);
}

std::string in_flight_file(const std::string& dir, int pipeline_rank) {
  return (fs::path(dir) / ("in_flight_rank" + std::to_string(pipeline_rank) + ".pt")).string();
}

void check_save_path(const std::string& dir) {
  if (dir.empty()) return;
  const fs::path path(dir);
  PPTRAIN_CHECK(!fs::exists(path) || fs::is_directory(path), "--save '", dir,
                "' is a file, not a folder");
  // A save replaces the folder whole: never one that holds something else.
  PPTRAIN_CHECK(
      !fs::is_directory(path) || fs::is_empty(path) || fs::is_regular_file(manifest_path(path)),
      "--save '", dir,
      "' is a folder that is not a pptrain checkpoint (no manifest.json); give a new or "
      "empty folder");
  const fs::path parent = path.parent_path();
  std::error_code error;
  if (!parent.empty()) fs::create_directories(parent, error);
  PPTRAIN_CHECK(parent.empty() || fs::is_directory(parent), "--save '", dir,
                "': cannot create its folder '", parent.string(), "'");
}

namespace {

// UserError unless every file the manifest `m` of `dir` lists is there with its size and
// checksum.
void expect_listed_files(const nlohmann::json& m, const std::string& dir, const std::string& flag) {
  const nlohmann::json files = m.value("files", nlohmann::json::object());
  for (const auto& [name, want] : files.items()) {
    const fs::path file = fs::path(dir) / name;
    PPTRAIN_CHECK(fs::is_regular_file(file), flag, ": missing checkpoint file '", file.string(),
                  "'");
    const std::string bytes = read_text_file(file.string(), "checkpoint file");
    PPTRAIN_CHECK(want.is_object() &&
                      want.value("bytes", -1LL) == static_cast<long long>(bytes.size()) &&
                      want.value("fnv1a64", "") == digest(bytes),
                  flag, ": '", file.string(),
                  "' is damaged (its size or checksum differs from the manifest)");
  }
}

// UserError unless every layer file is listed in the manifest `m` of `dir` and every file it
// lists is there with its size and checksum.
void expect_whole_files(const nlohmann::json& m, const std::string& dir, const ModelOptions& model,
                        const std::string& flag) {
  const nlohmann::json files = m.value("files", nlohmann::json::object());
  for (int layer = 0; layer < num_layers(model); ++layer) {
    const std::string name = fs::path(layer_file(dir, layer)).filename().string();
    PPTRAIN_CHECK(files.is_object() && files.contains(name), flag, " '", dir,
                  "': the manifest does not list ", name);
  }
  expect_listed_files(m, dir, flag);
}

}  // namespace

void check_checkpoint(const std::string& dir, const ModelOptions& model, const std::string& flag) {
  const nlohmann::json m = read_manifest(dir, flag);
  expect_fields(m.value("model", nlohmann::json::object()), model_json(model), flag, dir);
  expect_whole_files(m, dir, model, flag);
}

namespace {

// The manifest of `dir` when its model and the settings a resume shares are the plan's;
// UserError starting with --resume otherwise.
nlohmann::json manifest_of_same_run(const std::string& dir, const TrainingPlan& plan) {
  const nlohmann::json m = read_manifest(dir, "--resume");
  expect_fields(m.value("model", nlohmann::json::object()), model_json(plan.model), "--resume",
                dir);
  expect_fields(m.value("resume", nlohmann::json::object()), resume_json(plan), "--resume", dir);
  return m;
}

}  // namespace

bool holds_finished_run(const std::string& dir, const TrainingPlan& plan) {
  if (!fs::is_directory(dir)) return false;
  try {
    const nlohmann::json m = manifest_of_same_run(dir, plan);
    if (m.value("step", -1) != plan.steps) return false;
    const nlohmann::json async = m.value("asynchronous", nlohmann::json());
    if (async.is_object() != plan.asynchronous()) return false;
    if (plan.asynchronous()) expect_fields(async, asynchronous_json(plan), "--resume", dir);
    expect_whole_files(m, dir, plan.model, "--resume");
    return true;
  } catch (const UserError&) {
    return false;
  }
}

std::string checkpoint_precision(const std::string& dir) {
  return read_manifest(dir, "--resume").value("precision", "fp32");
}

int check_resume(const std::string& dir, const TrainingPlan& plan) {
  // The manifest's settings first, then the files (reading every file is the slow part).
  const nlohmann::json m = manifest_of_same_run(dir, plan);
  const int step = m.value("step", -1);
  PPTRAIN_CHECK(step >= 0, "--resume '", dir, "': the manifest has no step");
  // An asynchronous run saved before its last step has microbatches in flight, which only the
  // same list over the same run can take over.
  const nlohmann::json async = m.value("asynchronous", nlohmann::json());
  const bool in_flight = async.is_object() && step < async.value("steps", 0);
  if (plan.asynchronous()) {
    PPTRAIN_CHECK(async.is_object(), "--resume '", dir,
                  "': the checkpoint is of a synchronous run (", m.value("schedule", "?"),
                  "), and an asynchronous schedule continues only its own run; --load starts a "
                  "new run from its parameters");
    PPTRAIN_CHECK(in_flight, "--resume '", dir, "': the checkpoint was saved at the end of an ",
                  "asynchronous run of ", step,
                  " steps; an asynchronous schedule is one list over "
                  "the whole run, so it continues only a run saved before its end (--save-every); "
                  "--load starts a new run from its parameters");
    expect_fields(async, asynchronous_json(plan), "--resume", dir);
  } else {
    PPTRAIN_CHECK(!in_flight, "--resume '", dir, "': the checkpoint holds microbatches in flight ",
                  "of an asynchronous run (", async.value("schedule", "?"),
                  "), which only the same schedule and flags continue");
  }
  PPTRAIN_CHECK(step < plan.steps, "--resume '", dir, "': the checkpoint is at step ", step,
                " and --steps is ", plan.steps,
                ", so nothing is left to run (--steps counts from the start of the run)");
  expect_whole_files(m, dir, plan.model, "--resume");
  for (int r = 0; r < plan.ranks() && plan.asynchronous(); ++r) {
    const std::string name = fs::path(in_flight_file(dir, r)).filename().string();
    PPTRAIN_CHECK(m["files"].contains(name), "--resume '", dir, "': the manifest does not list ",
                  name);
  }
  return step;
}

std::vector<std::vector<ArchiveFile>> checkpoint_files(const RankCheckpoint& mine, int steps_done,
                                                       int run_steps, bool copy) {
  std::vector<std::vector<ArchiveFile>> groups;
  for (const Stage* stage : mine.stages) groups.push_back(stage->archives(mine.left_out, copy));
  for (const StageOptimizer* optimizer : mine.optimizers) {
    groups.push_back(optimizer->archives(copy));
  }
  if (mine.in_flight && steps_done < run_steps) {
    const std::string name = fs::path(in_flight_file("", mine.pipeline_rank)).filename().string();
    groups.push_back({archive_of(name, mine.in_flight(), copy)});
  }
  if (mine.loss_scale) {
    const std::string name = fs::path(loss_scale_file("")).filename().string();
    groups.push_back({archive_of(name, mine.loss_scale(), copy)});
  }
  return groups;
}

std::string loss_scale_file(const std::string& dir) {
  return (fs::path(dir) / "loss_scale.pt").string();
}

namespace {

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Collective: whether every rank did its part (`mine_ok` on each); the ranks then all go on or
// all stop, so none waits for a rank that gave up.
bool all_succeeded(bool mine_ok, Transport& transport) {
  auto failures = torch::tensor({mine_ok ? 0.0 : 1.0}, torch::kFloat64);
  transport.allreduce_sum(failures);
  return failures.item<double>() == 0;
}

// Runs `part` unless an earlier one failed, keeping the first failure's message.
template <typename Part>
void attempt(std::string& failure, Part&& part) {
  if (!failure.empty()) return;
  try {
    part();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "an unknown error";
  }
}

// Writes this rank's `groups` of the checkpoint after `steps_done` steps into `dir`, as every
// rank does over `transport`, keeping `keep` - 1 older ones: DIR.partial made by rank 0, every
// rank's files, then rank 0's manifest and swap. A rank that fails says so to the others at the
// next of the three collectives; then every rank throws std::runtime_error: its own error (naming
// the file), or that another rank failed. The previous checkpoint stays whole either way.
// `manifest` is the manifest without its list of files, which is added.
void write_checkpoint(const fs::path& dir, int keep, const nlohmann::ordered_json& manifest,
                      const std::vector<std::vector<ArchiveFile>>& groups, int steps_done,
                      Transport& transport) {
  const fs::path partial = dir.string() + ".partial";
  const bool leader = transport.rank() == 0;
  std::string failure;
  pause_for_test("PPTRAIN_TEST_SAVE_DELAY_MS");
  const auto stop_unless_all_succeeded = [&] {
    if (all_succeeded(failure.empty(), transport)) return;
    throw std::runtime_error(
        !failure.empty() ? failure
                         : "the checkpoint after step " + std::to_string(steps_done) +
                               " was not saved: " + kAnotherRankFailed + " to write its part; " +
                               dir.string() + " still holds the previous one");
  };
  if (leader) {
    attempt(failure, [&] {
      std::error_code error;
      fs::remove_all(partial, error);  // what an interrupted save left
      fs::create_directories(partial, error);
      if (!fs::is_directory(partial)) {
        throw std::runtime_error("cannot create the folder '" + partial.string() +
                                 "' for --save: " + error.message());
      }
    });
  }
  stop_unless_all_succeeded();
  for (const auto& group : groups) {
    attempt(failure, [&] {
      for (const ArchiveFile& file : group) write_archive_file(file, partial.string());
      pause_for_test();
    });
  }
  stop_unless_all_succeeded();  // every file is on disk
  if (leader) {
    attempt(failure, [&] {
      maybe_crash_for_test("layers");
      pause_for_test();
      write_file_to_disk(manifest_path(partial).string(),
                         with_files(manifest, partial).dump(2) + "\n", "checkpoint manifest");
      sync_folder(partial.string());
      maybe_crash_for_test("manifest");
      pause_for_test();
      const bool replaced = fs::exists(dir);
      swap_into_place(partial, dir);
      sync_folder(dir.parent_path().empty() ? "." : dir.parent_path().string());
      pause_for_test();
      if (replaced) retire(partial, dir, keep);  // the previous checkpoint
    });
  }
  stop_unless_all_succeeded();  // DIR is whole before any rank returns
}

}  // namespace

void save_checkpoint(const TrainingPlan& plan, const RankCheckpoint& mine, int steps_done,
                     Transport& transport) {
  write_checkpoint(plan.save_dir, plan.keep, manifest_of(plan, steps_done),
                   checkpoint_files(mine, steps_done, plan.steps, /*copy=*/false), steps_done,
                   transport);
}

CheckpointWriter::CheckpointWriter(const TrainingPlan& plan, Transport& transport)
    : plan_(plan), transport_(transport) {
  if (plan.background_save && !plan.save_dir.empty()) {
    own_transport_ = transport.independent("checkpoint");
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::join() {
  if (!thread_.joinable()) return;
  thread_.join();
  writing_ = false;
  if (!failure_.empty()) throw std::runtime_error(failure_);
}

double CheckpointWriter::save(const RankCheckpoint& mine, int steps_done) {
  const auto start = std::chrono::steady_clock::now();
  join();  // the previous save, which may have failed
  if (!own_transport_) {
    save_checkpoint(plan_, mine, steps_done, transport_);
    return seconds_since(start);
  }
  // Copies now; the files are made and written while training goes on.
  auto groups = checkpoint_files(mine, steps_done, plan_.steps, /*copy=*/true);
  writing_ = true;
  thread_ = std::thread([this, groups = std::move(groups), steps_done] {
    try {
      write_checkpoint(plan_.save_dir, plan_.keep, manifest_of(plan_, steps_done), groups,
                       steps_done, *own_transport_);
    } catch (const std::exception& e) {
      failure_ = e.what();
    }
    writing_ = false;
  });
  return seconds_since(start);
}

double CheckpointWriter::wait() {
  const auto start = std::chrono::steady_clock::now();
  join();
  return seconds_since(start);
}

void CheckpointWriter::check() {
  if (thread_.joinable() && !writing_) join();
}

namespace {

constexpr const char* kModuleFormat = "pptrain-module-checkpoint";
constexpr int kModuleVersion = 1;

// The checkpoint's fields (without its files) as its manifest records them.
nlohmann::ordered_json fields_of(const ModuleCheckpoint& what) {
  nlohmann::ordered_json out;
  out["step"] = what.step;
  out["schedule"] = what.schedule;
  out["num_stages"] = what.num_stages;
  out["pp"] = what.pp;
  out["data_parallel"] = what.data_parallel;
  out["zero"] = what.zero;
  out["optimizer"] = what.optimizer;
  out["steps"] = what.steps;
  return out;
}

nlohmann::ordered_json manifest_of(const ModuleCheckpoint& what) {
  nlohmann::ordered_json out;
  out["format"] = kModuleFormat;
  out["version"] = kModuleVersion;
  out.update(fields_of(what));
  return out;
}

}  // namespace

std::string to_json_text(const ModuleCheckpoint& what) {
  nlohmann::ordered_json out = fields_of(what);
  out["files"] = what.files;
  return out.dump();
}

void save_module_checkpoint(const std::string& dir, int keep, const ModuleCheckpoint& what,
                            const std::vector<std::vector<ArchiveFile>>& groups,
                            Transport& transport) {
  write_checkpoint(dir, keep, manifest_of(what), groups, what.step, transport);
}

ModuleCheckpoint read_module_checkpoint(const std::string& dir, const std::string& flag) {
  const nlohmann::json m = read_manifest(dir, flag, kModuleFormat, kModuleVersion);
  ModuleCheckpoint out;
  try {
    out.step = m.at("step").get<int>();
    out.schedule = m.at("schedule").get<std::string>();
    out.num_stages = m.at("num_stages").get<int>();
    out.pp = m.at("pp").get<int>();
    out.data_parallel = m.at("data_parallel").get<int>();
    out.zero = m.at("zero").get<int>();
    out.optimizer = m.at("optimizer").get<std::string>();
    out.steps = m.at("steps").get<int>();
    for (const auto& [name, file] : m.at("files").items()) out.files.push_back(name);
  } catch (const nlohmann::json::exception&) {
    throw UserError(flag + " '" + dir + "': manifest.json lacks a field or has one of the " +
                    "wrong type (step, schedule, num_stages, pp, data_parallel, zero, " +
                    "optimizer, steps, files)");
  }
  expect_listed_files(m, dir, flag);
  return out;
}

std::string newest_module_checkpoint(const std::string& save_dir,
                                     std::vector<std::string>* skipped) {
  return newest_accepted(
      save_dir, [](const std::string& dir) { read_module_checkpoint(dir, "resume"); }, skipped);
}

}  // namespace pptrain
