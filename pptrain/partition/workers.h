// The workers a run has, as measured: how fast each rank computes and how much memory it may
// use. The partitioners and the planner read it to give a slow rank less work.
//
//   {"format": "pptrain-workers-1",
//    "workers": [{"rank": 0, "speed": 1.0, "memory_limit_bytes": 0},
//                {"rank": 1, "speed": 0.34, "memory_limit_bytes": 8e9}]}
//
// `speed` is relative: a layer that takes t ms on a worker of speed 1 takes t / speed on this
// one (the fastest measured worker is 1). `memory_limit_bytes` 0 means none known. Ranks are
// 0..N-1, each once, in any order. `pptrain train --partition workers` measures them
// (one line per rank, job/worker_speeds.h); `pptrain partition` and `pptrain plan` take a file
// with --workers-profile.
//
//   WorkersProfile workers = read_workers_profile("workers.json");   // UserError on bad input
//   std::vector<double> speeds = workers.speeds();                     // [rank]
#pragma once

#include <string>
#include <vector>

namespace pptrain {

struct WorkerProfile {
  int rank = 0;
  double speed = 1;               // relative compute speed, > 0 (1: the fastest measured)
  double memory_limit_bytes = 0;  // what the rank may hold; 0: no limit known
  double products_per_s = 0;      // the measured probe rate behind `speed`; 0: not measured
};

struct WorkersProfile {
  std::vector<WorkerProfile> workers;  // indexed by rank
  std::string source;                  // a path or "<string>", for messages

  int size() const { return static_cast<int>(workers.size()); }
  std::vector<double> speeds() const;               // [rank]
  std::vector<double> memory_limits_bytes() const;  // [rank], 0 = none
  bool all_equal() const;  // every speed 1 and no memory limit: the planners' old case
};

// Speeds relative to the fastest: rate / max(rates). UserError for an empty list or a rate <= 0.
std::vector<double> relative_speeds(const std::vector<double>& rates);

// UserError (naming the source, the rank and the field) for malformed JSON, a missing or
// repeated rank, ranks that are not 0..N-1, a speed <= 0, a memory limit < 0.
WorkersProfile parse_workers_profile(const std::string& text,
                                     const std::string& source = "<string>");
WorkersProfile read_workers_profile(const std::string& path);
std::string to_json(const WorkersProfile& workers);

// UserError unless the profile has exactly `ranks` workers: "--workers-profile W.json has 3
// workers, but the run has 4 ranks (...)"; `what` names the run's side.
void check_workers_count(const WorkersProfile& workers, int ranks, const std::string& what);

// `pptrain train --worker-memory-limits BYTES[,BYTES...]`: one limit for every rank, or one per
// rank of the `ranks` (0: the rank's cgroup's). UserError naming the flag for a malformed number,
// a limit < 0 or another count.
std::vector<double> parse_worker_memory_limits(const std::string& text, int ranks);

// A placement: which worker (launch rank, process) runs each of the run's ranks, [rank] =
// worker, a permutation of 0 .. ranks - 1; empty or the identity: rank r on worker r.
// "1,0" and back (`pptrain train --placement`, the plan file's "placement"). parse_placement:
// UserError naming `what` for a malformed list, another count, or a worker given twice.
std::vector<int> parse_placement(const std::string& text, int ranks, const std::string& what);
std::string format_placement(const std::vector<int>& placement);
bool is_identity(const std::vector<int>& placement);

// One line per rank for a run's log: "rank 1: speed 0.34 (1210 products/s), memory limit 8 GB".
std::vector<std::string> describe_workers(const WorkersProfile& workers);

}  // namespace pptrain
