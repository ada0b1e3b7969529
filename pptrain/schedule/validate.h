// Checks that a schedule can run: every action in range and on its rank, every microbatch's work
// done exactly once, dependencies in order, sends matched with receives, and no deadlock.
//
//   ValidatedSchedule ok = validate(schedule);  // ScheduleError (a UserError) on the first problem
//   simulate(ok, cost);  Executor(ok, ...);      // they accept nothing else, and re-check nothing
//
// The message names the rank, the position in that rank's action list and the action, then shows
// the schedule's grid with the action marked:
//
//   rank 1, position 3 (1B0): backward of stage 1 microbatch 0 runs before its forward ...
//   rank 0 | 0F0  0F1  0B0  0B1
//   rank 1 | 1F0  1F1  1B1 [1B0]
//
// A compute-only schedule is checked as it is, then lowered (schedule.h) for the deadlock check;
// deadlocks are still reported at its own positions. The rules are listed in
// docs/SCHEDULE_FORMAT.md.
#pragma once

#include <string>

#include "pptrain/common/check.h"
#include "pptrain/schedule/schedule.h"

namespace pptrain {

class ScheduleError : public UserError {
 public:
  // `text` is the full message (what()): `message` with its location prefix and the grid.
  ScheduleError(int rank, int position, std::string message, const std::string& text)
      : UserError(text), rank_(rank), position_(position), message_(std::move(message)) {}

  int rank() const { return rank_; }          // -1: the error concerns the whole schedule
  int position() const { return position_; }  // index in rank()'s action list; -1: none
  const std::string& message() const { return message_; }  // one line, without location or grid

 private:
  int rank_;
  int position_;
  std::string message_;
};

// A schedule that passed validate(), with its SEND/RECV actions (lowered when it had none).
// Only validate() makes one, so whoever takes a ValidatedSchedule (the simulator, the executor)
// relies on every rule of this file without checking it again.
class ValidatedSchedule {
 public:
  const Schedule& schedule() const { return lowered_; }
  const Schedule& operator*() const { return lowered_; }
  const Schedule* operator->() const { return &lowered_; }
  // True when validate() lowered a compute-only schedule itself (lower(), schedule.h): every
  // RECV then sits right before the action that consumes it (after that action's other
  // receives) and every SEND right after the one that produces it, so that a message's timing
  // follows from its producer and consumer alone (the simulator's figures use that).
  bool lowered_here() const { return lowered_here_; }

 private:
  friend ValidatedSchedule validate(const Schedule& schedule);
  ValidatedSchedule(Schedule lowered, bool lowered_here)
      : lowered_(std::move(lowered)), lowered_here_(lowered_here) {}
  Schedule lowered_;
  bool lowered_here_ = false;
};

ValidatedSchedule validate(const Schedule& schedule);

}  // namespace pptrain
