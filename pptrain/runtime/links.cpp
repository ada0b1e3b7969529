#include "pptrain/runtime/links.h"

#include <map>

#include "pptrain/common/check.h"

namespace pptrain {

const char* link_name(LinkKind kind) {
  switch (kind) {
    case LinkKind::kNone:
      return "?";
    case LinkKind::kLocal:
      return "local";
    case LinkKind::kShm:
      return "shm";
    case LinkKind::kGloo:
      return "gloo";
    case LinkKind::kNccl:
      return "nccl";
    case LinkKind::kStagedShm:
      return "host-staged shm";
    case LinkKind::kStagedGloo:
      return "host-staged gloo";
  }
  return "?";
}

LinkKind staged(LinkKind kind) {
  if (kind == LinkKind::kShm) return LinkKind::kStagedShm;
  if (kind == LinkKind::kGloo) return LinkKind::kStagedGloo;
  return kind;
}

LinkTable::LinkTable(int world_size)
    : world_size_(world_size), kinds_(static_cast<size_t>(world_size * world_size)) {
  PPTRAIN_ASSERT(world_size >= 1, "a link table of ", world_size, " ranks");
}

size_t LinkTable::index(int from, int to) const {
  PPTRAIN_ASSERT(from >= 0 && from < world_size_ && to >= 0 && to < world_size_, "link ", from, "-",
                 to, " outside a world of ", world_size_);
  return static_cast<size_t>(from * world_size_ + to);
}

std::vector<int64_t> LinkTable::codes() const {
  std::vector<int64_t> out;
  for (LinkKind kind : kinds_) out.push_back(static_cast<int64_t>(kind));
  return out;
}

LinkTable LinkTable::from_codes(int world_size, const std::vector<int64_t>& codes) {
  LinkTable table(world_size);
  PPTRAIN_ASSERT(codes.size() == table.kinds_.size(), "a link table of ", world_size,
                 " ranks from ", codes.size(), " codes");
  for (size_t i = 0; i < codes.size(); ++i) {
    const int64_t code = codes[i];
    PPTRAIN_ASSERT(code >= 0 && code <= static_cast<int64_t>(LinkKind::kStagedGloo), "link code ",
                   code);
    table.kinds_[i] = static_cast<LinkKind>(code);
  }
  return table;
}

std::string LinkTable::pair_name(int a, int b) const {
  const LinkKind there = at(a, b), back = at(b, a);
  if (there == back) return link_name(there);
  return std::string(link_name(there)) + "/" + link_name(back);
}

std::string LinkTable::describe(const std::vector<std::pair<int, int>>& pairs) const {
  if (pairs.empty()) return "links: none (one rank)";
  // In the order each name first appears, so that the line reads in rank order.
  std::vector<std::string> names;
  std::map<std::string, std::string> listed;
  for (const auto& [a, b] : pairs) {
    const std::string name = pair_name(a, b);
    std::string& list = listed[name];
    if (list.empty()) names.push_back(name);
    list += (list.empty() ? "" : ", ") + std::to_string(a) + "-" + std::to_string(b);
  }
  std::string text = "links:";
  for (size_t i = 0; i < names.size(); ++i) {
    text += (i == 0 ? " " : "; ") + names[i] + " between ranks " + listed[names[i]];
  }
  return text;
}

}  // namespace pptrain
