#include "pptrain/partition/workers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"

namespace pptrain {
namespace {

constexpr const char* kWorkersFormat = "pptrain-workers-1";
// More ranks than any partitioner takes (partition.h's kMaxPartitionWorkers is 1024).
constexpr int64_t kMaxWorkers = 1 << 20;

double field_number(const nlohmann::json& worker, const char* field, double fallback,
                    const std::string& where) {
  if (!worker.contains(field)) return fallback;
  const nlohmann::json& v = worker.at(field);
  PPTRAIN_CHECK(v.is_number(), where, ": '", field, "' must be a number, got ", v.dump());
  const double x = v.get<double>();
  PPTRAIN_CHECK(std::isfinite(x), where, ": '", field, "' must be finite, got ", v.dump());
  return x;
}

// "a,b,c" as {"a", "b", "c"} ("" is one empty item).
std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
    items.push_back(text.substr(start, comma - start));
  }
  items.push_back(text.substr(start));
  return items;
}

// {1, 0} as "1,0".
std::string comma_list(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i > 0 ? "," : "") + std::to_string(values[i]);
  return out;
}

}  // namespace

std::vector<double> WorkersProfile::speeds() const {
  std::vector<double> out;
  for (const WorkerProfile& w : workers) out.push_back(w.speed);
  return out;
}

std::vector<double> WorkersProfile::memory_limits_bytes() const {
  std::vector<double> out;
  for (const WorkerProfile& w : workers) out.push_back(w.memory_limit_bytes);
  return out;
}

bool WorkersProfile::all_equal() const {
  return std::all_of(workers.begin(), workers.end(), [](const WorkerProfile& w) {
    return w.speed == 1 && w.memory_limit_bytes == 0;
  });
}

std::vector<double> relative_speeds(const std::vector<double>& rates) {
  PPTRAIN_CHECK(!rates.empty(), "no worker was measured");
  for (size_t r = 0; r < rates.size(); ++r) {
    PPTRAIN_CHECK(std::isfinite(rates[r]) && rates[r] > 0, "rank ", r,
                  " measured a compute rate of ", rates[r], "; expected > 0");
  }
  const double fastest = *std::max_element(rates.begin(), rates.end());
  std::vector<double> speeds;
  for (double rate : rates) speeds.push_back(rate / fastest);
  return speeds;
}

WorkersProfile parse_workers_profile(const std::string& text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(detail::concat(source, ": not valid JSON: ", e.what()));
  }
  PPTRAIN_CHECK(doc.is_object() && doc.contains("workers") && doc["workers"].is_array(), source,
                ": expected a workers profile, an object with a 'workers' array (format ",
                kWorkersFormat, ")");
  if (doc.contains("format")) {
    PPTRAIN_CHECK(doc["format"] == kWorkersFormat, source, ": format ", doc["format"].dump(),
                  ", expected \"", kWorkersFormat, "\"");
  }
  const nlohmann::json& list = doc["workers"];
  PPTRAIN_CHECK(!list.empty(), source, ": 'workers' is empty");
  PPTRAIN_CHECK(static_cast<int64_t>(list.size()) <= kMaxWorkers, source, ": ", list.size(),
                " workers, more than ", kMaxWorkers);
  WorkersProfile out;
  out.source = source;
  out.workers.resize(list.size());
  std::vector<bool> seen(list.size(), false);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = detail::concat(source, ": worker ", i);
    const nlohmann::json& w = list[i];
    PPTRAIN_CHECK(w.is_object(), where, ": expected an object, got ", w.dump());
    PPTRAIN_CHECK(w.contains("rank") && w["rank"].is_number_integer(), where,
                  ": needs an integer 'rank'");
    const auto rank = w["rank"].get<int64_t>();
    PPTRAIN_CHECK(rank >= 0 && rank < static_cast<int64_t>(list.size()), where, ": rank ", rank,
                  " is not in 0..", list.size() - 1, " (the profile has ", list.size(),
                  " workers)");
    PPTRAIN_CHECK(!seen[rank], where, ": rank ", rank, " appears twice");
    seen[rank] = true;
    const std::string of_rank = detail::concat(source, ": rank ", rank);
    WorkerProfile& profile = out.workers[rank];
    profile.rank = static_cast<int>(rank);
    PPTRAIN_CHECK(w.contains("speed"), of_rank, ": missing field 'speed'");
    profile.speed = field_number(w, "speed", 1, of_rank);
    PPTRAIN_CHECK(profile.speed > 0, of_rank, ": speed must be > 0, got ", profile.speed);
    profile.memory_limit_bytes = field_number(w, "memory_limit_bytes", 0, of_rank);
    PPTRAIN_CHECK(profile.memory_limit_bytes >= 0, of_rank,
                  ": memory_limit_bytes must be >= 0 (0: none), got ", profile.memory_limit_bytes);
    profile.products_per_s = field_number(w, "products_per_s", 0, of_rank);
    PPTRAIN_CHECK(profile.products_per_s >= 0, of_rank, ": products_per_s must be >= 0, got ",
                  profile.products_per_s);
  }
  return out;
}

WorkersProfile read_workers_profile(const std::string& path) {
  return parse_workers_profile(read_text_file(path, "--workers-profile file"),
                               "--workers-profile '" + path + "'");
}

std::string to_json(const WorkersProfile& workers) {
  nlohmann::ordered_json doc;
  doc["format"] = kWorkersFormat;
  doc["workers"] = nlohmann::ordered_json::array();
  for (const WorkerProfile& w : workers.workers) {
    doc["workers"].push_back({{"rank", w.rank},
                              {"speed", w.speed},
                              {"memory_limit_bytes", w.memory_limit_bytes},
                              {"products_per_s", w.products_per_s}});
  }
  return doc.dump(2);
}

void check_workers_count(const WorkersProfile& workers, int ranks, const std::string& what) {
  PPTRAIN_CHECK(workers.size() == ranks, workers.source, " has ", workers.size(), " worker",
                workers.size() == 1 ? "" : "s", ", but ", what, " has ", ranks, " rank",
                ranks == 1 ? "" : "s");
}

std::vector<double> parse_worker_memory_limits(const std::string& text, int ranks) {
  std::vector<double> limits;
  for (const std::string& item : comma_items(text)) {
    size_t used = 0;
    double bytes = -1;
    try {
      bytes = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    PPTRAIN_CHECK(used == item.size() && !item.empty() && std::isfinite(bytes) && bytes >= 0,
                  "--worker-memory-limits: '", item,
                  "' is not a number of bytes >= 0 (0: the rank's cgroup's limit)");
    limits.push_back(bytes);
  }
  if (limits.size() == 1) limits.assign(ranks, limits.front());
  PPTRAIN_CHECK(static_cast<int>(limits.size()) == ranks, "--worker-memory-limits has ",
                limits.size(), " limits, but the run has ", ranks,
                " ranks (give one for all, or one per rank)");
  return limits;
}

std::vector<int> parse_placement(const std::string& text, int ranks, const std::string& what) {
  std::vector<int> placement;
  for (const std::string& item : comma_items(text)) {
    const bool digits = !item.empty() && item.size() <= 9 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    PPTRAIN_CHECK(digits && std::stoi(item) < ranks, what, ": '", item, "' is not a worker of 0..",
                  ranks - 1, " (a list of the worker of each rank)");
    placement.push_back(std::stoi(item));
  }
  PPTRAIN_CHECK(static_cast<int>(placement.size()) == ranks, what, " has ", placement.size(),
                " workers, but the run has ", ranks, " ranks (one worker per rank)");
  std::vector<int> sorted = placement;
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  PPTRAIN_CHECK(twice == sorted.end(), what, " gives worker ", twice == sorted.end() ? 0 : *twice,
                " two ranks; each worker runs one");
  return placement;
}

std::string format_placement(const std::vector<int>& placement) {
  return comma_list(placement);
}

bool is_identity(const std::vector<int>& placement) {
  for (size_t r = 0; r < placement.size(); ++r) {
    if (placement[r] != static_cast<int>(r)) return false;
  }
  return true;
}

std::vector<int> parse_dp_shares(const std::string& text, const std::string& what) {
  std::vector<int> shares;
  for (const std::string& item : comma_items(text)) {
    const bool digits = !item.empty() && item.size() <= 9 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    PPTRAIN_CHECK(digits && std::stoi(item) >= 1, what, ": '", item,
                  "' is not a number of samples >= 1 (a list of each copy's samples per step)");
    shares.push_back(std::stoi(item));
  }
  return shares;
}

void check_dp_shares(const std::vector<int>& shares, int copies, int microbatches,
                     const std::string& what) {
  PPTRAIN_CHECK(static_cast<int>(shares.size()) == copies, what, " has ", shares.size(),
                " shares, but the run has ", copies, " copies of the pipeline (one share each)");
  for (size_t d = 0; d < shares.size(); ++d) {
    PPTRAIN_CHECK(shares[d] >= microbatches && shares[d] % microbatches == 0, what, ": copy ", d,
                  "'s share ", shares[d], " is not a positive multiple of the ", microbatches,
                  " microbatches (each copy splits its share into whole microbatches)");
  }
}

std::string format_dp_shares(const std::vector<int>& shares) {
  return comma_list(shares);
}

bool equal_shares(const std::vector<int>& shares) {
  return std::adjacent_find(shares.begin(), shares.end(), std::not_equal_to<int>()) == shares.end();
}

double share_weight(const std::vector<int>& shares, int copy) {
  double batch = 0;
  for (int share : shares) batch += share;
  return shares.at(copy) / batch;
}

std::vector<int> choose_dp_shares(const std::vector<double>& copy_rates, int batch,
                                  int microbatches) {
  const int copies = static_cast<int>(copy_rates.size());
  PPTRAIN_ASSERT(copies >= 1 && microbatches >= 1 && batch % microbatches == 0 &&
                     batch / microbatches >= copies,
                 "no shares of ", batch, " samples in ", microbatches, " microbatches for ", copies,
                 " copies");
  // In samples per microbatch: each copy one, then one more at a time to the copy that would
  // finish soonest with it (the largest time, k / rate, is then the least it can be).
  std::vector<int> per_microbatch(copies, 1);
  for (int left = batch / microbatches - copies; left > 0; --left) {
    int best = 0;
    for (int d = 1; d < copies; ++d) {
      if ((per_microbatch[d] + 1) / copy_rates[d] < (per_microbatch[best] + 1) / copy_rates[best]) {
        best = d;
      }
    }
    ++per_microbatch[best];
  }
  std::vector<int> shares;
  for (int k : per_microbatch) shares.push_back(k * microbatches);
  return shares;
}

std::vector<double> copy_rates(const std::vector<double>& rank_work_ms,
                               const std::vector<double>& speeds) {
  const size_t P = rank_work_ms.size();
  PPTRAIN_ASSERT(P >= 1 && speeds.size() % P == 0, speeds.size(), " ranks are not copies of ", P);
  std::vector<double> rates;
  for (size_t first = 0; first < speeds.size(); first += P) {
    double slowest_ms = 0;
    for (size_t p = 0; p < P; ++p) {
      slowest_ms = std::max(slowest_ms, rank_work_ms[p] / speeds[first + p]);
    }
    rates.push_back(1 / slowest_ms);
  }
  return rates;
}

double slowest_copy_time(const std::vector<int>& shares, const std::vector<double>& copy_rates) {
  double slowest = 0;
  for (size_t d = 0; d < shares.size(); ++d) {
    slowest = std::max(slowest, shares[d] / copy_rates.at(d));
  }
  return slowest;
}

std::vector<std::string> describe_workers(const WorkersProfile& workers) {
  std::vector<std::string> lines;
  for (const WorkerProfile& w : workers.workers) {
    char speed[64];
    std::snprintf(speed, sizeof speed, "%.2f", w.speed);
    std::string line = detail::concat("rank ", w.rank, ": speed ", speed);
    if (w.products_per_s > 0) {
      line += detail::concat(" (", static_cast<long long>(std::lround(w.products_per_s)),
                             " matrix products/s)");
    }
    line += ", memory limit " +
            (w.memory_limit_bytes > 0 ? format_bytes(w.memory_limit_bytes) : std::string("none"));
    lines.push_back(line);
  }
  return lines;
}

}  // namespace pptrain
