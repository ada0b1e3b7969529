// When to cut the model again during a run (`pptrain train --replan auto`): each rank's compute
// time per step is watched against what the current cut expects of it, and when a rank stays
// slower (or faster) than that for several steps, and a cut for the speeds now measured would
// make the slowest stage markedly faster, the watch gives that cut.
//
// A rank's pace is its wall-clock compute seconds per step over its stages' profiled work (the
// profile's F+I+W of their layers, times the microbatches). The first steps of a cut set each
// rank's own pace (its baseline, their median: profile errors and a rank's known speed are in
// it); from then on, a rank whose pace leaves [baseline / threshold, baseline x threshold] for
// `steps` steps in a row has changed speed, to speed_at_cut x baseline / pace (the median pace
// of those steps). The watch does not cut the model itself: its Cutter does, for those speeds
// (job/worker_speeds.h: the cut of `--partition workers`, within the ranks' memory limits and
// over placements). When no cut can be made the watch takes the paces now as the cut's (it
// says so once, not at every step). Everything is a function of the compute times it is given,
// so ranks that feed it the same numbers decide the same.
//
//   StragglerWatch watch(profile, microbatches, ranges, speeds, cutter);  // speeds of the cut
//   if (auto replan = watch.observe(compute_s)) {                         // once per step, [rank]
//     ... replan->kept: say why the cut stays; else move to replan->ranges (and placement) at
//     this step boundary, with a new watch for the new cut ...
//   }
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"

namespace pptrain {

struct StragglerOptions {
  int settle_steps = 2;    // steps skipped after a cut (warm-up, first-touch allocations)
  int baseline_steps = 3;  // steps whose median pace is a rank's baseline
  int steps = 3;           // steps in a row outside the band before it counts
  // The band around the baseline, as a factor: wide enough that two ranks sharing a physical
  // core (whose speeds move 15-30% as the other computes more or less) do not count.
  double threshold = 1.5;
  double min_gain = 0.15;  // the new cut's slowest stage at least this share faster
};

struct Replan {
  int rank = 0;                // the rank furthest from its baseline
  double slowdown = 1;         // its pace over its baseline (> 1: slower)
  std::vector<double> speeds;  // [rank] relative speeds now, the fastest 1
  double before_s = 0;         // the slowest stage now, seconds per step, predicted
  // From the Cutter:
  std::vector<LayerRange> ranges;  // the new cut, stage s on rank s
  std::vector<int> placement;      // [rank] = the worker to play it after the move (workers.h);
                                   // empty: every rank stays on its worker
  double after_s = 0;              // with the new cut, predicted
  std::string kept;                // why no cut can be made (the cut stays); empty: a new cut
};

// Cuts the model for `replan.speeds`: fills `ranges`, `after_s` and, when ranks are to move to
// other workers, `placement`; or, when no cut can be made, says why in `kept`.
using Cutter = std::function<void(Replan& replan)>;

class StragglerWatch {
 public:
  // `profile`: per-microbatch layer times; `ranges`: the current cut, stage s on rank s;
  // `speeds`: the relative speeds it was made for ([rank]; empty: all 1); `cut`: what cuts
  // for the speeds measured.
  StragglerWatch(Profile profile, int microbatches, std::vector<LayerRange> ranges,
                 std::vector<double> speeds, Cutter cut, StragglerOptions options = {});

  // One step's wall-clock compute seconds of each rank. A new cut when one pays, or a Replan
  // with `kept` when a rank changed speed and no cut can be made; else nothing.
  std::optional<Replan> observe(const std::vector<double>& compute_s);

  // What the cut expects of `rank` per step: its stages' profiled compute, seconds.
  double profiled_s(int rank) const { return work_s_.at(rank); }

 private:
  Profile profile_;
  int microbatches_;
  std::vector<LayerRange> ranges_;
  std::vector<double> speeds_;
  Cutter cut_;
  StragglerOptions options_;
  std::vector<double> work_s_;  // [rank] profiled compute of its stage per step
  std::vector<std::vector<double>> baseline_paces_;  // [rank] the baseline steps' paces
  std::vector<double> baseline_;                     // [rank] their median
  std::vector<std::vector<double>> recent_;          // [rank] the last `steps` paces
  int seen_ = 0;
  int outside_ = 0;  // consecutive steps with some rank outside its band
};

// One line for a run's log: "rank 1 computes 2.90x its pace at the cut; stage layers 0-4,5-9 ->
// 0-6,7-9, placement 1,0 (slowest stage 1.20 s -> 0.81 s per step, predicted)" (the placement
// when it changes), or, when the cut stays, "...; stage layers 0-4,5-9 stay: <kept>".
std::string describe_replan(const Replan& replan, const std::vector<LayerRange>& before);

}  // namespace pptrain
