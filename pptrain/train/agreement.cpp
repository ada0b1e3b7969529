#include "pptrain/train/agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <variant>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/workers.h"
#include "pptrain/train/control_tags.h"

namespace pptrain {
namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

std::string to_text(double value) {
  char out[32];
  std::snprintf(out, sizeof out, "%.17g", value);
  return out;
}

// "flag\tvalue\n" lines and back. Values never hold a newline or a tab: flags are one token.
std::string encode(const Settings& settings) {
  std::string text;
  for (const auto& [flag, value] : settings) text += flag + "\t" + value + "\n";
  return text;
}
Settings decode(const std::string& text) {
  Settings settings;
  size_t at = 0;
  while (at < text.size()) {
    const size_t tab = text.find('\t', at), end = text.find('\n', at);
    PPTRAIN_ASSERT(tab != std::string::npos && end != std::string::npos && tab < end,
                   "malformed settings text from a peer");
    settings.emplace_back(text.substr(at, tab - at), text.substr(tab + 1, end - tab - 1));
    at = end + 1;
  }
  return settings;
}

void send_text(const std::string& text, int peer, ControlTag length_tag, ControlTag text_tag,
               Transport& transport) {
  auto length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
  auto sent_length = transport.send(length, peer, tag_of(length_tag));
  if (!text.empty()) {  // an empty text is its length alone
    auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
    std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
    transport.send(bytes, peer, tag_of(text_tag)).wait();
  }
  sent_length.wait();
}

std::string recv_text(int peer, ControlTag length_tag, ControlTag text_tag, Transport& transport) {
  auto length = torch::empty({1}, torch::kInt64);
  transport.recv(length, peer, tag_of(length_tag)).wait();
  if (length.item<int64_t>() == 0) return "";
  auto bytes = torch::empty({length.item<int64_t>()}, torch::kUInt8);
  transport.recv(bytes, peer, tag_of(text_tag)).wait();
  const auto* data = bytes.data_ptr<uint8_t>();
  return std::string(data, data + bytes.numel());
}

// Rank 0's verdict on every rank's settings: empty when they agree, else the error message for
// the first flag that differs, naming up to three ranks that differ from rank 0.
std::string verdict(const std::vector<Settings>& ranks) {
  const Settings& mine = ranks[0];
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& [flag, value] = mine[i];
    std::string differing;
    int listed = 0, more = 0;
    for (size_t r = 1; r < ranks.size(); ++r) {
      const std::string theirs = i < ranks[r].size() && ranks[r][i].first == flag
                                     ? ranks[r][i].second
                                     : std::string("(another pptrain version)");
      if (theirs == value) continue;
      if (listed++ < 3) {
        differing += ", rank " + std::to_string(r) + " has " + theirs;
      } else {
        ++more;
      }
    }
    if (differing.empty()) continue;
    if (more) differing += ", and " + std::to_string(more) + " more ranks";
    return "ranks disagree on " + flag + ": rank 0 has " + value + differing +
           " (start every rank with the same flags)";
  }
  return "";
}

// A family option's value as given, for comparing ranks.
std::string family_value_text(const FamilyValue& value) {
  if (const bool* on = std::get_if<bool>(&value)) return *on ? "on" : "off";
  if (const int* count = std::get_if<int>(&value)) return std::to_string(*count);
  return to_text(std::get<double>(value));
}

}  // namespace

Settings plan_settings(const TrainingPlan& plan) {
  const ModelOptions& m = plan.model;
  Settings settings = {
      {"--pp", std::to_string(plan.ranks())},
      {"--dp", std::to_string(plan.copies)},
      {"--dp-shares", plan.dp_shares.empty() ? "(equal)" : format_dp_shares(plan.dp_shares)},
      {"--zero", std::to_string(plan.zero)},
      {"--model", m.kind},
      {"--layers", std::to_string(m.layers)},
      {"--d-model", std::to_string(m.d_model)},
      {"--heads", std::to_string(m.heads)},
      {"--seq-len", std::to_string(m.seq_len)},
      {"--seq-len-range (its MIN)", std::to_string(plan.data.min_seq_len)},
      {"--tie-embeddings", m.tie_embeddings ? "on" : "off"},
      {"--seed", std::to_string(m.seed)},
      {"--data", plan.data.source},
      {"--batch-size", std::to_string(plan.data.batch_size)},
      {"--microbatches", std::to_string(plan.microbatches())},
      {"--schedule", plan.schedule->name},
      {"--chunks (stages per rank)", std::to_string(plan.schedule->chunks())},
      {"the schedule's actions (--schedule-file)", digest(to_csv(*plan.schedule))},
      {"--partition (stage layers)", format_stage_layers(plan.stage_layers)},
      {"--steps", std::to_string(plan.steps)},
      {"--optimizer", plan.optimizer.kind},
      {"--lr", to_text(plan.optimizer.lr)},
      {"--momentum", to_text(plan.optimizer.momentum)},
      {"--warmup-steps", std::to_string(plan.optimizer.warmup_steps)},
      {"--clip", to_text(plan.optimizer.clip)},
      {"--recompute", plan.recompute ? "on" : "off"},
      {"the weight rule (the family options)", plan.weights.name()},
      {"--skip-nonfinite", plan.optimizer.skip_nonfinite ? "on" : "off"},
      {"--precision", precision_name(plan.precision)},
      {"--load", plan.load_dir.empty() ? "(none)" : plan.load_dir},
      {"--resume", plan.resume_dir.empty() ? "(none)" : plan.resume_dir},
      {"--save", plan.save_dir.empty() ? "(none)" : plan.save_dir},
      {"--save-every", std::to_string(plan.save_every)},
      {"--keep", std::to_string(plan.keep)},
      {"--sync-save", plan.background_save ? "off" : "on"},
  };
  // The schedule family's options (generators/registry.h), each as given or "(default)".
  for (const FamilyOption* option : family_options()) {
    const auto given = plan.family.find(option->flag);
    settings.emplace_back(
        option->flag, given == plan.family.end() ? "(default)" : family_value_text(given->second));
  }
  return settings;
}

void check_ranks_agree(const TrainingPlan& plan, Transport& transport) {
  const int world = transport.world_size();
  if (world == 1) return;
  const Settings mine = plan_settings(plan);
  std::string outcome;
  if (transport.rank() != 0) {
    send_text(encode(mine), 0, ControlTag::kSettingsLength, ControlTag::kSettings, transport);
    outcome = recv_text(0, ControlTag::kVerdictLength, ControlTag::kVerdict, transport);
  } else {
    std::vector<Settings> ranks = {mine};
    for (int peer = 1; peer < world; ++peer) {
      ranks.push_back(
          decode(recv_text(peer, ControlTag::kSettingsLength, ControlTag::kSettings, transport)));
    }
    outcome = verdict(ranks);
    for (int peer = 1; peer < world; ++peer) {
      send_text(outcome, peer, ControlTag::kVerdictLength, ControlTag::kVerdict, transport);
    }
  }
  if (!outcome.empty()) throw UserError(outcome);
}

}  // namespace pptrain
