// A schedule as a text grid: one row per rank, one column per position in the rank's action
// list. For terminals and for error messages, where one action can be marked.
//
//   rank 0 | 0F0  0F1  0B0  0B1
//   rank 1 |      1F0  1B0 [1F1] 1B1       <- marked
//
// Long schedules (thousands of positions) can be cut to a window of positions around the mark:
// mark_rank = 1, mark_position = 700, window = 8 shows positions 692..708 of every rank, with
// "..." where rows were cut.
#pragma once

#include <string>

#include "pptrain/schedule/schedule.h"

namespace pptrain {

struct GridOptions {
  int mark_rank = -1;      // rank of the action to mark with [brackets]; -1: none
  int mark_position = -1;  // its index in that rank's action list
  bool with_comms = true;  // false: leave SEND/RECV actions out of the picture
  int window = 0;          // > 0: show only positions within `window` of mark_position (or the
                           // first 2 * window positions when nothing is marked); 0: all
};

std::string render_grid(const Schedule& schedule, const GridOptions& options = {});

}  // namespace pptrain
