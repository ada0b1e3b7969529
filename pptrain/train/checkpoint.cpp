#include "pptrain/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/train/partition_plan.h"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "pptrain-checkpoint";
constexpr int kVersion = 1;

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
  }
  return out;
}

nlohmann::ordered_json manifest_of(const TrainingPlan& plan, const fs::path& dir) {
  nlohmann::ordered_json out;
  out["format"] = kFormat;
  out["version"] = kVersion;
  out["model"] = model_json(plan.model);
  out["stage_layers"] = format_stage_layers(plan.stage_layers);
  out["schedule"] = plan.schedule->name;
  out["pp"] = plan.ranks();
  out["steps"] = plan.steps;
  out["files"] = nlohmann::ordered_json::object();
  for (int layer = 0; layer < num_layers(plan.model); ++layer) {
    const fs::path file = layer_file(dir.string(), layer);
    const std::string bytes = read_text_file(file.string(), "checkpoint file");
    out["files"][file.filename().string()] = {{"bytes", bytes.size()}, {"fnv1a64", digest(bytes)}};
  }
  return out;
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

}  // namespace

void check_save_path(const std::string& dir) {
  if (dir.empty()) return;
  const fs::path path(dir);
  PPTRAIN_CHECK(!fs::exists(path) || fs::is_directory(path), "--save '", dir,
                "' is a file, not a folder");
  const fs::path parent = path.parent_path();
  std::error_code error;
  if (!parent.empty()) fs::create_directories(parent, error);
  PPTRAIN_CHECK(parent.empty() || fs::is_directory(parent), "--save '", dir,
                "': cannot create its folder '", parent.string(), "'");
}

void check_checkpoint(const std::string& dir, const ModelOptions& model) {
  const fs::path manifest = manifest_path(dir);
  PPTRAIN_CHECK(fs::is_regular_file(manifest), "--load '", dir,
                "' is not a whole checkpoint: it has no manifest.json (an interrupted save, or "
                "not a folder pptrain saved)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text_file(manifest.string(), "checkpoint manifest"));
  } catch (const nlohmann::json::exception&) {
    throw UserError("--load '" + dir + "': manifest.json is not valid JSON");
  }
  PPTRAIN_CHECK(m.is_object() && m.value("format", "") == kFormat, "--load '", dir,
                "': manifest.json is not a pptrain checkpoint manifest");
  PPTRAIN_CHECK(m.value("version", 0) == kVersion, "--load '", dir, "': checkpoint format version ",
                m.value("version", 0), ", this pptrain reads ", kVersion);
  const nlohmann::json want = model_json(model);
  const nlohmann::json have = m.value("model", nlohmann::json::object());
  for (const auto& [field, value] : want.items()) {
    const std::string has = have.contains(field) ? have[field].dump() : std::string("none");
    PPTRAIN_CHECK(have.contains(field) && have[field] == value, "--load '", dir,
                  "': checkpoint has ", field, " ", has, ", flags say ", value.dump());
  }
  const nlohmann::json files = m.value("files", nlohmann::json::object());
  for (int layer = 0; layer < num_layers(model); ++layer) {
    const fs::path file = layer_file(dir, layer);
    const std::string name = file.filename().string();
    PPTRAIN_CHECK(files.contains(name) && files[name].is_object(), "--load '", dir,
                  "': the manifest does not list ", name);
    PPTRAIN_CHECK(fs::is_regular_file(file), "--load: missing parameter file '", file.string(),
                  "'");
    const std::string bytes = read_text_file(file.string(), "checkpoint file");
    PPTRAIN_CHECK(files[name].value("bytes", -1LL) == static_cast<long long>(bytes.size()) &&
                      files[name].value("fnv1a64", "") == digest(bytes),
                  "--load: '", file.string(),
                  "' is damaged (its size or checksum differs from the manifest)");
  }
}

void save_checkpoint(const TrainingPlan& plan, const std::vector<Stage*>& stages,
                     Transport& transport) {
  const fs::path dir(plan.save_dir);
  const fs::path partial = dir.string() + ".partial";
  const bool leader = transport.rank() == 0;
  if (leader) {
    std::error_code error;
    fs::remove_all(partial, error);  // what an interrupted save left
    fs::create_directories(partial, error);
    PPTRAIN_CHECK(fs::is_directory(partial), "cannot create the folder '", partial.string(),
                  "' for --save");
  }
  transport.barrier();
  for (const Stage* stage : stages) stage->save(partial.string());
  transport.barrier();  // every layer is on disk
  if (leader) {
    maybe_crash_for_test("layers");
    write_text_file(manifest_path(partial).string(), manifest_of(plan, partial).dump(2) + "\n",
                    "checkpoint manifest");
    maybe_crash_for_test("manifest");
    swap_into_place(partial, dir);
    std::error_code error;
    fs::remove_all(partial, error);  // the previous checkpoint, if there was one
  }
  transport.barrier();  // DIR is whole before any rank returns
}

}  // namespace pptrain
