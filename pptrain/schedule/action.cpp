#include "pptrain/schedule/action.h"

#include <array>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <vector>

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
// (readers keep references), equal parts share one index. A dualpipev schedule of P = 256 makes
// half a million of them, and every pass over it reads them: interning looks the parts up by
// their hash in an open-addressed table (one slot read per new composite), and reading takes no
// lock. Entries live in chunks that never move; a reader has its index from an action made after
// the entry was stored, and each chunk's address is published with release.
class Composites {
 public:
  int intern(const std::vector<Action>& parts) {
    const uint32_t hash = hash_of(parts);
    const std::lock_guard<std::mutex> lock(mutex_);
    size_t slot = hash & (slots_.size() - 1);
    for (; slots_[slot].index >= 0; slot = (slot + 1) & (slots_.size() - 1)) {
      if (slots_[slot].hash == hash && entry(slots_[slot].index) == parts) {
        return slots_[slot].index;
      }
    }
    const int index = size_.load(std::memory_order_relaxed);
    const size_t chunk = static_cast<size_t>(index) >> kChunkBits;
    PPTRAIN_CHECK(chunk < kMaxChunks, "more than ", kMaxChunks << kChunkBits,
                  " distinct composite actions in one process");
    if (!chunks_[chunk].load(std::memory_order_relaxed)) {
      chunks_[chunk].store(new std::vector<Action>[kChunkSize], std::memory_order_release);
    }
    chunks_[chunk].load(std::memory_order_relaxed)[index & (kChunkSize - 1)] = parts;
    slots_[slot] = Slot{hash, index};
    size_.store(index + 1, std::memory_order_release);
    if (2 * static_cast<size_t>(index + 1) > slots_.size()) grow();
    return index;
  }
  const std::vector<Action>& parts(int index) const {
    PPTRAIN_ASSERT(index >= 0 && index < size_.load(std::memory_order_acquire), "no composite ",
                   index);
    return entry(index);
  }

 private:
  static constexpr int kChunkBits = 12;
  static constexpr int kChunkSize = 1 << kChunkBits;
  static constexpr size_t kMaxChunks = 1 << 14;  // 67 million composites

  struct Slot {
    uint32_t hash = 0;
    int index = -1;  // -1: empty
  };

  const std::vector<Action>& entry(int index) const {
    return chunks_[static_cast<size_t>(index) >> kChunkBits].load(
        std::memory_order_acquire)[index & (kChunkSize - 1)];
  }
  static uint32_t hash_of(const std::vector<Action>& parts) {
    uint64_t hash = parts.size();
    for (const Action& part : parts) {
      for (const int field : {static_cast<int>(part.op), part.stage, part.microbatch, part.peer}) {
        hash = (hash ^ static_cast<uint32_t>(field)) * 0x9E3779B97F4A7C15ULL;
        hash ^= hash >> 29;
      }
    }
    return static_cast<uint32_t>(hash ^ (hash >> 32));
  }
  // Twice the slots, the entries placed again by their hash (under the lock).
  void grow() {
    std::vector<Slot> larger(2 * slots_.size());
    for (const Slot& s : slots_) {
      if (s.index < 0) continue;
      size_t slot = s.hash & (larger.size() - 1);
      while (larger[slot].index >= 0) slot = (slot + 1) & (larger.size() - 1);
      larger[slot] = s;
    }
    slots_.swap(larger);
  }

  std::mutex mutex_;                                 // interning: the slots and the next entry
  std::vector<Slot> slots_ = std::vector<Slot>(64);  // a power of two, at most half used
  std::atomic<int> size_{0};
  std::array<std::atomic<std::vector<Action>*>, kMaxChunks> chunks_{};
};

// Never destroyed: a process that made half a million composites would free each at exit for
// nothing (the chunks stay reachable from here for leak checkers).
Composites& composites() {
  static Composites* const table = new Composites;
  return *table;
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
