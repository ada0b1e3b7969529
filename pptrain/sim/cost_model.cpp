#include "pptrain/sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// One stage's value: the per-stage vector if given, else the whole-share figure split over the
// rank's chunks.
double per_stage(const std::vector<double>& stage_values, double whole_share, int stage,
                 int num_stages, int num_ranks, const char* what) {
  if (stage_values.empty()) return whole_share * num_ranks / num_stages;
  PPTRAIN_CHECK(static_cast<int>(stage_values.size()) == num_stages, "cost model: ", what, " has ",
                stage_values.size(), " entries but the schedule has ", num_stages, " stages");
  const double value = stage_values[stage];
  PPTRAIN_CHECK(std::isfinite(value) && value >= 0, "cost model: ", what, "[", stage,
                "] must be a finite number >= 0, got ", value);
  return value;
}

// The keys of the text form and the scalar each one sets, in the order to_string prints them.
const std::pair<const char*, double CostModel::*> kKeys[] = {
    {"F", &CostModel::forward},          {"I", &CostModel::backward_input},
    {"W", &CostModel::backward_weight},  {"comm", &CostModel::comm},
    {"skip", &CostModel::skip_comm},     {"weights", &CostModel::weights},
    {"reduce", &CostModel::reduce},      {"action", &CostModel::action_overhead},
    {"send", &CostModel::send_overhead}, {"recv", &CostModel::recv_overhead},
};
constexpr const char* kKeyList = "F, I, W, comm, skip, weights, reduce, action, send or recv";

// The keys that also take one value per stage, "F=1:2:3", and the vector each one sets.
const std::pair<const char*, std::vector<double> CostModel::*> kStageKeys[] = {
    {"F", &CostModel::stage_forward},
    {"I", &CostModel::stage_backward_input},
    {"W", &CostModel::stage_backward_weight},
};

// A value of the text form: a finite number >= 0; UserError naming `key` otherwise.
double number_of(const std::string& key, const std::string& text) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PPTRAIN_CHECK(used > 0 && used == text.size() && std::isfinite(value) && value >= 0,
                "cost model: value of ", key, " must be a finite number >= 0, got '", text, "'");
  return value;
}

}  // namespace

CostModel CostModel::parse(const std::string& text) {
  CostModel cost;
  std::stringstream pieces(text);
  std::string piece;
  while (std::getline(pieces, piece, ',')) {
    piece = trim(piece);
    if (piece.empty()) continue;
    const auto eq = piece.find('=');
    PPTRAIN_CHECK(eq != std::string::npos, "cost model: expected KEY=VALUE, got '", piece,
                  "' (keys: ", kKeyList, ")");
    const std::string key = trim(piece.substr(0, eq));
    const std::string value_text = trim(piece.substr(eq + 1));
    if (value_text.find(':') != std::string::npos) {  // one value per stage
      std::vector<double> CostModel::*stages = nullptr;
      for (const auto& [name, member] : kStageKeys) {
        if (key == name) stages = member;
      }
      PPTRAIN_CHECK(stages != nullptr, "cost model: only F, I and W take a value per stage ",
                    "(F=1:2:3), got '", piece, "'");
      std::vector<double> values;
      std::stringstream parts(value_text);
      for (std::string part; std::getline(parts, part, ':');) {
        values.push_back(number_of(key, trim(part)));
      }
      PPTRAIN_CHECK(value_text.back() != ':', "cost model: value of ", key,
                    " must be a finite number >= 0, got ''");
      cost.*stages = std::move(values);
      continue;
    }
    const double value = number_of(key, value_text);
    double CostModel::*field = nullptr;
    for (const auto& [name, member] : kKeys) {
      if (key == name) field = member;
    }
    PPTRAIN_CHECK(field != nullptr, "cost model: unknown key '", key, "' in '", piece,
                  "'; expected ", kKeyList);
    cost.*field = value;
  }
  return cost;
}

std::string CostModel::to_string() const {
  std::ostringstream out;
  const char* separator = "";
  for (const auto& [name, member] : kKeys) {
    // skip=0 (as comm), weights=0 (not counted), reduce=0 and the overheads at 0 are left out,
    // so cost models without them print as before.
    const bool always = member == &CostModel::forward || member == &CostModel::backward_input ||
                        member == &CostModel::backward_weight || member == &CostModel::comm;
    if (!always && this->*member == 0) continue;
    out << separator << name << '=' << this->*member;
    separator = ",";
  }
  return out.str();
}

double CostModel::time(const Action& action, int num_stages, int num_ranks) const {
  const auto of = [&](const std::vector<double>& stage_values, double whole_share,
                      const char* what) {
    return per_stage(stage_values, whole_share, action.stage, num_stages, num_ranks, what);
  };
  switch (action.op) {
    case Op::F:
      return of(stage_forward, forward, "stage_forward");
    case Op::I:
      return of(stage_backward_input, backward_input, "stage_backward_input");
    case Op::W:
      return of(stage_backward_weight, backward_weight, "stage_backward_weight");
    case Op::B:
      if (!stage_backward.empty()) return of(stage_backward, 0, "stage_backward");
      return of(stage_backward_input, backward_input, "stage_backward_input") +
             of(stage_backward_weight, backward_weight, "stage_backward_weight");
    case Op::OVERLAP_F_B: {
      double sum = 0;
      for (const Action& part : action.parts()) sum += time(part, num_stages, num_ranks);
      return sum;
    }
    case Op::REDUCE_GRAD:
      return reduce_time(action.stage, num_stages, num_ranks);
    default:
      return 0;  // SEND/RECV occupy neither rank; their latency is `comm`
  }
}

double CostModel::overhead(const Action& action) const {
  double value = 0;
  const char* what = "";
  if (is_compute(action.op)) {
    value = action_overhead;
    what = "action_overhead";
  } else if (is_send(action.op)) {
    value = send_overhead;
    what = "send_overhead";
  } else if (is_recv(action.op)) {
    value = recv_overhead;
    what = "recv_overhead";
  }
  PPTRAIN_CHECK(std::isfinite(value) && value >= 0, "cost model: ", what,
                " must be a finite number >= 0, got ", value);
  return value;
}

double CostModel::reduce_time(int stage, int num_stages, int num_ranks) const {
  PPTRAIN_CHECK(replicas >= 1, "cost model: data-parallel replicas must be >= 1, got ", replicas);
  return reduce_time(stage, num_stages, num_ranks, replicas);
}

double CostModel::reduce_time(int stage, int num_stages, int num_ranks, int group) const {
  PPTRAIN_ASSERT(group >= 1, "a reduction over ", group, " replicas");
  if (!stage_reduce.empty())
    return per_stage(stage_reduce, 0, stage, num_stages, 1, "stage_reduce");
  if (group == 1) return 0;
  if (stage_grad_bytes.empty()) return reduce * num_ranks / num_stages;
  PPTRAIN_CHECK(std::isfinite(reduce_bandwidth) && reduce_bandwidth > 0,
                "cost model: stage_grad_bytes needs a reduce_bandwidth > 0 (bytes per time unit), "
                "got ",
                reduce_bandwidth);
  PPTRAIN_CHECK(std::isfinite(reduce_latency) && reduce_latency >= 0,
                "cost model: reduce_latency must be a finite number >= 0, got ", reduce_latency);
  const double bytes = per_stage(stage_grad_bytes, 0, stage, num_stages, 1, "stage_grad_bytes");
  const double d = group;
  return 2 * (d - 1) / d * bytes / reduce_bandwidth + reduce_latency;
}

double CostModel::activation(int stage, int num_stages, int num_ranks) const {
  return per_stage(stage_activation, 1.0, stage, num_stages, num_ranks, "stage_activation");
}

double CostModel::weight_stash(int stage, int num_stages, int num_ranks) const {
  PPTRAIN_CHECK(mem_w_ratio >= 0 && mem_w_ratio <= 1,
                "cost model: the weight-gradient share of the activations (--mem-w-ratio) must be "
                "in [0, 1], got ",
                mem_w_ratio);
  if (stage_weight_stash.empty()) return mem_w_ratio * activation(stage, num_stages, num_ranks);
  return per_stage(stage_weight_stash, 0, stage, num_stages, 1, "stage_weight_stash");
}

StageCosts CostModel::stage_costs(int num_stages, int num_ranks) const {
  StageCosts out;
  // The automatic schedules know no overheads: a compute action's is part of its time, and a
  // message's two sides are part of its latency (with none, x + 0 is x: the same plans).
  const double action = overhead(Action::make(Op::F, 0, 0));
  out.comm =
      comm + overhead(Action::make(Op::SEND_F, 0, 0)) + overhead(Action::make(Op::RECV_F, 0, 0));
  for (int s = 0; s < num_stages; ++s) {
    const auto of = [&](Op op) {
      return time(Action::make(op, s, 0), num_stages, num_ranks) + action;
    };
    out.forward.push_back(of(Op::F));
    out.backward_input.push_back(of(Op::I));
    out.backward_weight.push_back(of(Op::W));
    out.activation.push_back(activation(s, num_stages, num_ranks));
    out.weight_stash.push_back(weight_stash(s, num_stages, num_ranks));
  }
  return out;
}

double CostModel::weight_memory(int stage, int num_stages, int num_ranks) const {
  return per_stage(stage_weights, weights, stage, num_stages, num_ranks, "stage_weights");
}

CostModel cost_model_from_flags(const std::string& cost, double mem_w_ratio) {
  CostModel out;
  try {
    out = CostModel::parse(cost);
  } catch (const UserError& e) {
    throw UserError(std::string("--cost: ") + e.what());
  }
  PPTRAIN_CHECK(mem_w_ratio >= 0 && mem_w_ratio <= 1,
                "--mem-w-ratio must be in [0, 1] (the share of a microbatch's activations W still "
                "needs after I), got ",
                mem_w_ratio);
  out.mem_w_ratio = mem_w_ratio;
  return out;
}

CostModel cost_from_profile(const Profile& profile, const std::vector<LayerRange>& stages,
                            int replicas) {
  const int layers = static_cast<int>(profile.layers.size());
  PPTRAIN_CHECK(replicas <= 1 || profile.network.measured(), profile.source,
                ": the profile has no all-reduce measurement for --dp ", replicas,
                " (profile again with --allreduce-ranks 2)");
  const NetworkProfile& network = profile.network;
  CostModel cost;
  cost.replicas = replicas;
  cost.reduce_bandwidth = network.bandwidth_bytes_per_s / 1000;  // bytes per ms
  cost.reduce_latency = network.latency_ms;
  cost.action_overhead = profile.overheads.action_ms;
  cost.send_overhead = profile.overheads.send_ms;
  cost.recv_overhead = profile.overheads.recv_ms;
  int next = 0;
  for (const auto& [first, last] : stages) {
    PPTRAIN_CHECK(first == next && last >= first && last < layers, profile.source,
                  ": stage layers ", first, "-", last, " do not continue the stages before them ",
                  "within the profile's ", layers, " layers");
    next = last + 1;
    double f = 0, i = 0, w = 0, params = 0;
    for (int l = first; l <= last; ++l) {
      f += profile.layers[l].forward_ms;
      i += profile.layers[l].backward_input_ms;
      w += profile.layers[l].backward_weight_ms;
      params += profile.layers[l].parameter_bytes;
    }
    cost.stage_forward.push_back(f);
    cost.stage_backward_input.push_back(i);
    cost.stage_backward_weight.push_back(w);
    cost.stage_grad_bytes.push_back(params);
    if (last + 1 < layers && network.measured()) {
      cost.comm = std::max(cost.comm, network.latency_ms + profile.layers[last].activation_bytes /
                                                               cost.reduce_bandwidth);
    }
  }
  PPTRAIN_CHECK(next == layers, profile.source, ": the stages cover layers 0-", next - 1,
                " of the profile's ", layers);
  return cost;
}

}  // namespace pptrain
