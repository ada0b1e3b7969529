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

// Data-parallel shares: the samples of each step's batch that each of D copies of the pipeline
// trains on, [copy]. Copy d takes rows [shares[0] + ... + shares[d-1], + shares[d]) of the batch,
// in M microbatches of shares[d] / M samples, and its gradients (a mean over its own samples)
// weigh share_weight(shares, d) = shares[d] / batch in the copies' sum, so that a step is the
// whole batch's mean whatever the shares. Unequal shares give a copy holding a slower rank
// fewer samples (`pptrain train --dp-shares`, or chosen from the ranks' speeds by
// `--partition workers` and `pptrain plan --workers-profile`); empty: batch / D each.
//
//   std::vector<int> shares = parse_dp_shares("24,8", "--dp-shares");   // {24, 8}
//   check_dp_shares(shares, /*copies=*/2, /*microbatches=*/4, "--dp-shares");
//   share_weight(shares, 1);                                             // 0.25
//   choose_dp_shares({1.0, 0.34}, /*batch=*/32, /*microbatches=*/4);    // {24, 8}
//
// parse_dp_shares: UserError naming `what` unless `text` is a list of whole numbers >= 1.
// check_dp_shares: UserError naming `what` unless there are `copies` of them, each a multiple of
// `microbatches` (every microbatch of a copy whole).
std::vector<int> parse_dp_shares(const std::string& text, const std::string& what);
void check_dp_shares(const std::vector<int>& shares, int copies, int microbatches,
                     const std::string& what);
std::string format_dp_shares(const std::vector<int>& shares);  // "24,8"
bool equal_shares(const std::vector<int>& shares);             // every share the same (or none)
double share_weight(const std::vector<int>& shares, int copy);
// The shares that finish a step soonest when copy d computes `copy_rates[d]` samples per unit of
// time (any unit; only their ratios count): each a multiple of `microbatches`, at least one
// microbatch of one sample, summing to `batch` (a multiple of `microbatches`); the copy whose
// share / rate is largest is as small as it can be (the lowest copy first on a tie). Equal rates
// and a batch of D x M x k samples give equal shares.
std::vector<int> choose_dp_shares(const std::vector<double>& copy_rates, int batch,
                                  int microbatches);
// Each copy's rate in samples per ms for a cut whose pipeline rank p computes `rank_work_ms[p]`
// per sample on a worker of speed 1, on ranks of `speeds` ([world rank], copy d's ranks
// d x P .. d x P + P - 1): 1 / max_p (rank_work_ms[p] / speed), its slowest rank's pace.
std::vector<double> copy_rates(const std::vector<double>& rank_work_ms,
                               const std::vector<double>& speeds);
// The step's length under `shares` at `copy_rates`: the slowest copy's share / rate.
double slowest_copy_time(const std::vector<int>& shares, const std::vector<double>& copy_rates);

// One line per rank for a run's log: "rank 1: speed 0.34 (1210 products/s), memory limit 8 GB".
std::vector<std::string> describe_workers(const WorkersProfile& workers);

}  // namespace pptrain
