#include "pptrain/render/grid.h"

#include <algorithm>

namespace pptrain {

std::string render_grid(const Schedule& schedule, const GridOptions& options) {
  // Cell text per rank, then one common column width so that steps line up.
  std::vector<std::vector<std::string>> cells(schedule.actions.size());
  size_t width = 1;
  for (size_t r = 0; r < schedule.actions.size(); ++r) {
    const auto& list = schedule.actions[r];
    for (size_t i = 0; i < list.size(); ++i) {
      if (!options.with_comms && is_comm(list[i].op)) continue;
      std::string text = to_string(list[i]);
      const bool marked = static_cast<int>(r) == options.mark_rank &&
                          static_cast<int>(i) == options.mark_position;
      text = marked ? "[" + text + "]" : " " + text + " ";
      width = std::max(width, text.size());
      cells[r].push_back(std::move(text));
    }
  }
  std::string out;
  for (size_t r = 0; r < cells.size(); ++r) {
    // Pad labels to the widest rank number so that the bars line up.
    std::string label = "rank " + std::to_string(r);
    label.resize(5 + std::to_string(cells.size() - 1).size(), ' ');
    out += label + " |";
    for (const auto& text : cells[r]) out += text + std::string(width - text.size(), ' ');
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  }
  return out;
}

}  // namespace pptrain
