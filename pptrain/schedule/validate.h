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
// A compute-only schedule is checked as it is: its deadlock check runs the compute actions, each
// waiting for what lowering (semantics.h) would make it receive, which is the lowered schedule's
// check without its messages (a send follows its producer at once and never blocks). The rules are
// listed in docs/SCHEDULE_FORMAT.md.
#pragma once

#include <memory>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/common/once.h"
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

// A schedule that passed validate(). Only validate() makes one, so whoever takes a
// ValidatedSchedule (the simulator, the executor) relies on every rule of this file without
// checking it again. It keeps the schedule as given; a compute-only one is lowered (schedule.h)
// the first time its SEND/RECV actions are asked for, so that a pass which needs none of them
// (the simulator's figures, sim/simulator.h) never makes them. Copies share that lowered form.
class ValidatedSchedule {
 public:
  // The schedule with its SEND/RECV actions, as the executor runs it: the one given, or the
  // compute-only one lowered on first use. Safe to call from several threads.
  const Schedule& schedule() const;
  const Schedule& operator*() const { return schedule(); }
  const Schedule* operator->() const { return &schedule(); }
  // The schedule validate() was given: compute-only when lowered_here(), else schedule() itself.
  // Everything but its action lists is schedule()'s too.
  const Schedule& given() const { return given_; }
  // True when the schedule was given compute-only and schedule() is lower(given()): every RECV
  // then sits right before the action that consumes it (after that action's other receives)
  // and every SEND right after the one that produces it, so that a message's timing follows
  // from its producer and consumer alone (the simulator's figures use that).
  bool lowered_here() const { return lowering_ != nullptr; }

 private:
  friend ValidatedSchedule validate(Schedule schedule);
  struct Lowering {
    Once once;
    Schedule lowered;
  };
  ValidatedSchedule(Schedule given, bool compute_only)
      : given_(std::move(given)),
        lowering_(compute_only ? std::make_shared<Lowering>() : nullptr) {}
  Schedule given_;
  std::shared_ptr<Lowering> lowering_;  // a compute-only schedule's lowered form; else null
};

// Takes the schedule by value: std::move it in when it is not needed after (it is kept).
ValidatedSchedule validate(Schedule schedule);

}  // namespace pptrain
