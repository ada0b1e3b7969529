#include "pptrain/schedule/action.h"

#include <cctype>
#include <map>
#include <memory>
#include <mutex>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

struct OpName {
  Op op;
  const char* name;
};
// Longest names first, so that "SEND_F" is not read as "S" + ... when matching prefixes.
constexpr OpName kOpNames[] = {
    {Op::REDUCE_GRAD, "REDUCE_GRAD"},
    {Op::OVERLAP_F_B, "OVERLAP_F_B"},
    {Op::SEND_F, "SEND_F"},
    {Op::RECV_F, "RECV_F"},
    {Op::SEND_B, "SEND_B"},
    {Op::RECV_B, "RECV_B"},
    {Op::F, "F"},
    {Op::I, "I"},
    {Op::W, "W"},
    {Op::B, "B"},
};

// Reads a non-negative decimal number at text[pos...]; returns -1 if there is none.
int read_number(std::string_view text, size_t& pos) {
  size_t start = pos;
  long value = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    value = value * 10 + (text[pos] - '0');
    if (value > 1'000'000'000) return -1;
    ++pos;
  }
  return pos == start ? -1 : static_cast<int>(value);
}

// The parts of every composite made in this process, each once: an entry never changes or moves
// (readers keep references), equal parts (by their text) share one index.
class Composites {
 public:
  int intern(const std::vector<Action>& parts) {
    std::string key;
    for (const Action& part : parts) key += to_string(part) + ";";
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto [it, added] = index_.emplace(std::move(key), static_cast<int>(entries_.size()));
    if (added) entries_.push_back(std::make_unique<const std::vector<Action>>(parts));
    return it->second;
  }
  const std::vector<Action>& parts(int index) {
    const std::lock_guard<std::mutex> lock(mutex_);
    PPTRAIN_ASSERT(index >= 0 && index < static_cast<int>(entries_.size()), "no composite ", index);
    return *entries_[index];
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> index_;
  std::vector<std::unique_ptr<const std::vector<Action>>> entries_;
};

Composites& composites() {
  static Composites table;
  return table;
}

}  // namespace

Action Action::overlap(const std::vector<Action>& parts) {
  return Action{Op::OVERLAP_F_B, -1, -1, composites().intern(parts)};
}

const std::vector<Action>& Action::parts() const {
  static const std::vector<Action> kNone;
  return op == Op::OVERLAP_F_B ? composites().parts(peer) : kNone;
}

const char* op_name(Op op) {
  for (const auto& entry : kOpNames) {
    if (entry.op == op) return entry.name;
  }
  PPTRAIN_UNREACHABLE("unknown op");
}

std::string to_string(const Action& action) {
  if (action.op == Op::OVERLAP_F_B) {
    std::string text = "(";
    const std::vector<Action>& parts = action.parts();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) text += ";";
      text += to_string(parts[i]);
    }
    return text + ")" + op_name(action.op);
  }
  if (action.op == Op::REDUCE_GRAD) return std::to_string(action.stage) + op_name(action.op);
  std::string text =
      std::to_string(action.stage) + op_name(action.op) + std::to_string(action.microbatch);
  if (is_skip_message(action))
    text += (is_send(action.op) ? ">" : "<") + std::to_string(action.peer);
  return text;
}

Action parse_action(std::string_view text) {
  auto fail = [&]() {
    throw UserError("'" + std::string(text) +
                    "' is not an action (expected <stage><op><microbatch> such as 0F1, 2W5, "
                    "1SEND_F3, 0SEND_F3>2, (0F7;7B3)OVERLAP_F_B, or <stage>REDUCE_GRAD)");
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  if (text.empty()) fail();
  if (text.front() == '(') {
    const std::string_view suffix = ")OVERLAP_F_B";
    if (text.size() <= suffix.size() + 1 || text.substr(text.size() - suffix.size()) != suffix)
      fail();
    std::string_view inner = text.substr(1, text.size() - suffix.size() - 1);
    std::vector<Action> parts;
    while (!inner.empty()) {
      size_t cut = inner.find(';');
      parts.push_back(parse_action(inner.substr(0, cut)));
      if (parts.back().op == Op::OVERLAP_F_B) fail();
      if (cut == std::string_view::npos) break;
      inner.remove_prefix(cut + 1);
    }
    if (parts.size() < 2) fail();
    return Action::overlap(parts);
  }
  size_t pos = 0;
  int stage = read_number(text, pos);
  if (stage < 0) fail();
  for (const auto& entry : kOpNames) {
    std::string_view name = entry.name;
    if (entry.op == Op::OVERLAP_F_B || text.substr(pos, name.size()) != name) continue;
    size_t after = pos + name.size();
    if (entry.op == Op::REDUCE_GRAD) {
      if (after != text.size()) fail();
      return Action::make(entry.op, stage, -1);
    }
    int microbatch = read_number(text, after);
    if (microbatch < 0) fail();
    if (after == text.size()) return Action::make(entry.op, stage, microbatch);
    // A skip message: '>' and the stage it goes to after a SEND, '<' and its sender after a RECV.
    const char arrow = is_send(entry.op) ? '>' : is_recv(entry.op) ? '<' : 0;
    if (!arrow || text[after] != arrow) fail();
    ++after;
    const int peer = read_number(text, after);
    if (peer < 0 || after != text.size()) fail();
    return Action::skip(entry.op, stage, microbatch, peer);
  }
  fail();
  return {};
}

}  // namespace pptrain
