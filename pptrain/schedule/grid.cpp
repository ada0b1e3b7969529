#include "pptrain/schedule/grid.h"

#include <algorithm>

namespace pptrain {

std::string render_grid(const Schedule& schedule, const GridOptions& options) {
  // Positions shown: [first, last). The window is the same for every rank, so that a marked
  // action's neighbours on other ranks stay in view.
  size_t longest = 0;
  for (const auto& list : schedule.actions) longest = std::max(longest, list.size());
  size_t first = 0, last = longest;
  if (options.window > 0) {
    const size_t window = static_cast<size_t>(options.window);
    const size_t centre =
        options.mark_position >= 0 ? static_cast<size_t>(options.mark_position) : window;
    first = centre > window ? centre - window : 0;
    last = std::min(longest, centre + window + 1);
  }
  // Cell text per rank, then one common column width so that steps line up.
  std::vector<std::vector<std::string>> cells(schedule.actions.size());
  size_t width = 1;
  for (size_t r = 0; r < schedule.actions.size(); ++r) {
    const auto& list = schedule.actions[r];
    for (size_t i = first; i < std::min(last, list.size()); ++i) {
      if (!options.with_comms && is_comm(list[i].op)) continue;
      std::string text = to_string(list[i]);
      const bool marked =
          static_cast<int>(r) == options.mark_rank && static_cast<int>(i) == options.mark_position;
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
    if (first > 0) out += " ...";
    for (const auto& text : cells[r]) out += text + std::string(width - text.size(), ' ');
    while (!out.empty() && out.back() == ' ') out.pop_back();
    if (last < schedule.actions[r].size()) out += " ...";
    out += '\n';
  }
  return out;
}

}  // namespace pptrain
