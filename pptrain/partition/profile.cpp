#include "pptrain/partition/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"

namespace pptrain {
namespace {

std::string_view trim(std::string_view s) {
  const char* blanks = " \t\r\n";
  size_t first = s.find_first_not_of(blanks);
  if (first == std::string_view::npos) return {};
  size_t last = s.find_last_not_of(blanks);
  return s.substr(first, last - first + 1);
}

// A finite number taking up the whole string, or false.
bool parse_number(std::string_view text, double& value) {
  std::string s(trim(text));
  if (s.empty()) return false;
  char* end = nullptr;
  value = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(value);
}

// ---- our JSON -----------------------------------------------------------------------------

constexpr const char* kProfileFormat = "pptrain-profile-1";

double layer_number(const nlohmann::json& layer, const char* field, const std::string& where) {
  PPTRAIN_CHECK(layer.contains(field), where, ": missing field '", field, "'");
  const nlohmann::json& v = layer.at(field);
  PPTRAIN_CHECK(v.is_number(), where, ": field '", field, "' must be a number, got ", v.dump());
  double x = v.get<double>();
  PPTRAIN_CHECK(std::isfinite(x) && x >= 0, where, ": field '", field, "' must be >= 0, got ", x);
  return x;
}

// ---- PipeDream graph.txt ------------------------------------------------------------------

struct GraphNode {
  std::string id;
  std::string description;
  double forward_ms = 0, backward_ms = 0, activation_bytes = 0, parameter_bytes = 0;
  int line = 0;
};

struct GraphEdge {
  std::string from, to;
  int line = 0;
};

// activation_size may be a list "[a; b; c]" for a node with several outputs: their sum.
bool parse_size(std::string_view text, double& value) {
  text = trim(text);
  if (text.empty() || text.front() != '[') return parse_number(text, value);
  if (text.back() != ']') return false;
  value = 0;
  text = text.substr(1, text.size() - 2);
  while (!text.empty()) {
    size_t semi = text.find(';');
    double part = 0;
    if (!parse_number(text.substr(0, semi), part)) return false;
    value += part;
    text = semi == std::string_view::npos ? std::string_view{} : text.substr(semi + 1);
  }
  return true;
}

GraphNode parse_node_line(std::string_view line, const std::string& where) {
  const std::string_view sep = " -- ";
  size_t first = line.find(sep);
  size_t last = line.rfind(sep);
  PPTRAIN_CHECK(first != std::string_view::npos && last != first, where,
                ": expected a node line 'nodeN -- Description -- forward_compute_time=..., ...' "
                "or an edge line '\\tnodeA -- nodeB', got '",
                line, "'");
  GraphNode node;
  node.id = std::string(trim(line.substr(0, first)));
  node.description = std::string(trim(line.substr(first + sep.size(), last - first - sep.size())));
  PPTRAIN_CHECK(!node.id.empty(), where, ": node line without a node id");

  // Fields are "key=value" separated by ", "; a list value uses ';' inside, never ','.
  std::map<std::string, std::string_view> fields;
  std::string_view rest = line.substr(last + sep.size());
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view field = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (field.empty()) continue;
    size_t eq = field.find('=');
    PPTRAIN_CHECK(eq != std::string_view::npos, where, ": node '", node.id,
                  "': expected key=value, got '", field, "'");
    fields[std::string(trim(field.substr(0, eq)))] = field.substr(eq + 1);
  }
  auto read = [&](const char* key, double& out) {
    auto it = fields.find(key);
    PPTRAIN_CHECK(it != fields.end(), where, ": node '", node.id, "' has no ", key);
    PPTRAIN_CHECK(parse_size(it->second, out), where, ": node '", node.id, "': ", key,
                  " must be a number, got '", it->second, "'");
    PPTRAIN_CHECK(out >= 0, where, ": node '", node.id, "': ", key, " must be >= 0, got ", out);
  };
  read("forward_compute_time", node.forward_ms);
  read("backward_compute_time", node.backward_ms);
  read("activation_size", node.activation_bytes);
  read("parameter_size", node.parameter_bytes);
  return node;
}

// "node12" sorts before "node100": ids compare by prefix, then by the trailing number. The
// profiler numbers nodes in execution order, so this keeps the chain close to that order.
bool natural_less(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t digits = s.find_last_not_of("0123456789") + 1;  // npos + 1 == 0: all digits
    std::string prefix = s.substr(0, digits);
    std::string number = s.substr(digits);
    return std::make_tuple(prefix, number.size(), number);
  };
  auto ka = split(a), kb = split(b);
  return ka != kb ? ka < kb : a < b;
}

}  // namespace

Profile parse_profile_json(const std::string& text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // bad syntax, or a number out of range
    throw UserError(detail::concat(source, ": not valid JSON: ", e.what()));
  }
  PPTRAIN_CHECK(doc.is_object(), source, ": expected a JSON object with a 'layers' array");
  if (doc.contains("format")) {
    PPTRAIN_CHECK(doc["format"] == kProfileFormat, source, ": unknown format ",
                  doc["format"].dump(), ", expected \"", kProfileFormat, "\"");
  }
  PPTRAIN_CHECK(doc.contains("layers") && doc["layers"].is_array(), source,
                ": missing 'layers' array");
  const nlohmann::json& layers = doc["layers"];
  PPTRAIN_CHECK(!layers.empty(), source, ": 'layers' is empty; a profile needs at least one layer");

  Profile profile;
  profile.source = source;
  for (size_t i = 0; i < layers.size(); ++i) {
    const nlohmann::json& l = layers[i];
    std::string where = detail::concat(source, ": layer ", i);
    PPTRAIN_CHECK(l.is_object(), where, ": expected an object, got ", l.dump());
    PPTRAIN_CHECK(l.contains("name") && l["name"].is_string(), where,
                  ": missing field 'name' (a string)");
    LayerProfile layer;
    layer.name = l["name"].get<std::string>();
    where += " ('" + layer.name + "')";
    layer.forward_ms = layer_number(l, "forward_ms", where);
    layer.backward_input_ms = layer_number(l, "backward_input_ms", where);
    layer.backward_weight_ms = layer_number(l, "backward_weight_ms", where);
    layer.activation_bytes = layer_number(l, "activation_bytes", where);
    layer.stash_bytes = layer_number(l, "stash_bytes", where);
    layer.parameter_bytes = layer_number(l, "parameter_bytes", where);
    for (auto [field, value] :
         {std::pair{"weight_stash_bytes", &layer.weight_stash_bytes},
          std::pair{"forward_transient_bytes", &layer.forward_transient_bytes},
          std::pair{"backward_transient_bytes", &layer.backward_transient_bytes}}) {
      if (l.contains(field)) *value = layer_number(l, field, where);
    }
    for (auto [field, value, whole, whole_field] :
         {std::tuple{"stash_fixed_bytes", &layer.stash_fixed_bytes, layer.stash_bytes,
                     "stash_bytes"},
          std::tuple{"forward_transient_fixed_bytes", &layer.forward_transient_fixed_bytes,
                     layer.forward_transient_bytes, "forward_transient_bytes"},
          std::tuple{"backward_transient_fixed_bytes", &layer.backward_transient_fixed_bytes,
                     layer.backward_transient_bytes, "backward_transient_bytes"}}) {
      if (!l.contains(field)) continue;
      *value = layer_number(l, field, where);
      PPTRAIN_CHECK(*value <= std::max(whole, 0.0), where, ": ", field, " (", *value, ") exceeds ",
                    whole_field, " (", whole < 0 ? std::string("not given") : detail::concat(whole),
                    "), of which it is a part");
    }
    profile.layers.push_back(std::move(layer));
  }
  if (doc.contains("settings") && doc["settings"].is_object() &&
      doc["settings"].contains("microbatch_size")) {
    const double size = layer_number(doc["settings"], "microbatch_size", source + ": settings");
    PPTRAIN_CHECK(size >= 1 && size <= 1 << 30 && size == static_cast<int>(size), source,
                  ": settings: microbatch_size must be a whole number >= 1, got ", size);
    profile.microbatch_size = static_cast<int>(size);
  }
  if (doc.contains("settings") && doc["settings"].is_object() &&
      doc["settings"].contains("precision")) {
    const nlohmann::json& p = doc["settings"]["precision"];
    PPTRAIN_CHECK(p.is_string(), source, ": settings: precision must be a string, got ", p.dump());
    profile.precision = parse_precision(p.get<std::string>(), source + ": settings: precision");
  }
  if (doc.contains("batch")) {
    const nlohmann::json& b = doc["batch"];
    const std::string where = source + ": batch";
    PPTRAIN_CHECK(b.is_object(), where, ": expected an object, got ", b.dump());
    profile.input_bytes = layer_number(b, "input_bytes", where);
    profile.target_bytes = layer_number(b, "target_bytes", where);
  }
  if (doc.contains("network")) {
    const nlohmann::json& n = doc["network"];
    const std::string where = source + ": network";
    PPTRAIN_CHECK(n.is_object(), where, ": expected an object, got ", n.dump());
    const double ranks = layer_number(n, "allreduce_ranks", where);
    PPTRAIN_CHECK(ranks >= 2 && ranks <= 1 << 20 && ranks == static_cast<int>(ranks), where,
                  ": allreduce_ranks must be a whole number >= 2, got ",
                  n["allreduce_ranks"].dump());
    profile.network.ranks = static_cast<int>(ranks);
    profile.network.bandwidth_bytes_per_s =
        layer_number(n, "allreduce_bandwidth_bytes_per_s", where);
    PPTRAIN_CHECK(profile.network.bandwidth_bytes_per_s > 0, where,
                  ": allreduce_bandwidth_bytes_per_s must be > 0");
    profile.network.latency_ms = layer_number(n, "allreduce_latency_ms", where);
  }
  if (doc.contains("overheads")) {
    const nlohmann::json& o = doc["overheads"];
    const std::string where = source + ": overheads";
    PPTRAIN_CHECK(o.is_object(), where, ": expected an object, got ", o.dump());
    profile.overheads.action_ms = layer_number(o, "action_ms", where);
    profile.overheads.send_ms = layer_number(o, "send_ms", where);
    profile.overheads.recv_ms = layer_number(o, "recv_ms", where);
  }
  return profile;
}

Profile parse_pipedream_graph(const std::string& text, const std::string& source) {
  std::vector<GraphNode> nodes;
  std::vector<GraphEdge> edges;
  std::map<std::string, int> index;  // node id -> position in `nodes`

  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    std::string_view line = raw;
    if (trim(line).empty()) continue;
    std::string where = detail::concat(source, ":", line_no);
    if (line.front() == '\t' || line.front() == ' ') {
      std::string_view body = trim(line);
      size_t sep = body.find(" -- ");
      PPTRAIN_CHECK(sep != std::string_view::npos, where,
                    ": expected an edge line '\\tnodeA -- nodeB', got '", body, "'");
      GraphEdge e{std::string(trim(body.substr(0, sep))), std::string(trim(body.substr(sep + 4))),
                  line_no};
      PPTRAIN_CHECK(!e.from.empty() && !e.to.empty(), where, ": edge with an empty node id");
      edges.push_back(std::move(e));
      continue;
    }
    GraphNode node = parse_node_line(line, where);
    node.line = line_no;
    PPTRAIN_CHECK(!index.count(node.id), where, ": node '", node.id,
                  "' defined twice (first on line ", nodes[index[node.id]].line, ")");
    index[node.id] = static_cast<int>(nodes.size());
    nodes.push_back(std::move(node));
  }
  PPTRAIN_CHECK(!nodes.empty(), source, ": no node lines; an empty profile cannot be partitioned");

  const int n = static_cast<int>(nodes.size());
  std::vector<std::set<int>> succ(n), pred(n);
  for (const GraphEdge& e : edges) {
    for (const std::string* id : {&e.from, &e.to}) {
      PPTRAIN_CHECK(index.count(*id), source, ":", e.line, ": edge ", e.from, " -- ", e.to,
                    " names unknown node '", *id, "'");
    }
    int a = index[e.from], b = index[e.to];
    PPTRAIN_CHECK(a != b, source, ":", e.line, ": edge from node '", e.from,
                  "' to itself: the graph has a cycle");
    succ[a].insert(b);
    pred[b].insert(a);
  }

  // As PipeDream's optimizer: inputs are always in the first stage, so they are not layers to
  // place; unused "__getitem__" outputs are not layers either.
  std::vector<bool> dropped(n, false);
  auto drop = [&](int v) {
    dropped[v] = true;
    for (int s : succ[v]) pred[s].erase(v);
    for (int p : pred[v]) succ[p].erase(v);
    succ[v].clear();
    pred[v].clear();
  };
  for (int v = 0; v < n; ++v) {
    if (pred[v].empty() && nodes[v].description.rfind("Input", 0) == 0) drop(v);
  }
  for (int v = 0; v < n; ++v) {
    if (!dropped[v] && succ[v].empty() && nodes[v].description.rfind("__getitem__", 0) == 0) {
      drop(v);
    }
  }

  // Kahn's algorithm, always taking the ready node with the smallest id.
  auto later = [&](int a, int b) { return natural_less(nodes[b].id, nodes[a].id); };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  std::vector<int> in_degree(n);
  int kept = 0;
  for (int v = 0; v < n; ++v) {
    if (dropped[v]) continue;
    ++kept;
    in_degree[v] = static_cast<int>(pred[v].size());
    if (in_degree[v] == 0) ready.push(v);
  }
  PPTRAIN_CHECK(kept > 0, source, ": only Input nodes; an empty profile cannot be partitioned");
  std::vector<int> order;
  while (!ready.empty()) {
    int v = ready.top();
    ready.pop();
    order.push_back(v);
    for (int s : succ[v]) {
      if (--in_degree[s] == 0) ready.push(s);
    }
  }
  if (static_cast<int>(order.size()) < kept) {
    // Every node left has a predecessor that is also left: walking back must repeat a node,
    // and the first one repeated lies on a cycle.
    int v = 0;
    while (dropped[v] || in_degree[v] == 0) ++v;
    std::vector<bool> seen(n, false);
    while (!seen[v]) {
      seen[v] = true;
      for (int p : pred[v]) {
        if (in_degree[p] > 0) {
          v = p;
          break;
        }
      }
    }
    throw UserError(detail::concat(source, ":", nodes[v].line,
                                   ": the graph has a cycle through node '", nodes[v].id, "'"));
  }

  // Bytes crossing the cut after chain position p: each tensor produced at or before p and
  // consumed after p, counted once however many consumers it has.
  const int L = static_cast<int>(order.size());
  std::vector<int> position(n, -1);
  for (int p = 0; p < L; ++p) position[order[p]] = p;
  std::vector<double> delta(L + 1, 0.0);
  for (int v : order) {
    int last_use = position[v];
    for (int s : succ[v]) last_use = std::max(last_use, position[s]);
    delta[position[v]] += nodes[v].activation_bytes;
    delta[last_use] -= nodes[v].activation_bytes;
  }

  Profile profile;
  profile.source = source;
  double crossing = 0;
  for (int p = 0; p < L; ++p) {
    const GraphNode& node = nodes[order[p]];
    crossing += delta[p];
    LayerProfile layer;
    layer.name = node.id + " " + node.description;
    layer.forward_ms = node.forward_ms;
    layer.backward_input_ms = node.backward_ms;
    layer.activation_bytes = std::max(0.0, crossing);  // no negative rounding residue
    layer.stash_bytes = node.activation_bytes;
    layer.parameter_bytes = node.parameter_bytes;
    profile.layers.push_back(std::move(layer));
  }
  return profile;
}

bool Profile::splits_backward() const {
  for (const LayerProfile& layer : layers) {
    if (layer.backward_weight_ms > 0) return true;
  }
  return false;
}

Profile at_precision(Profile profile, Precision precision) {
  if (profile.precision == precision) return profile;
  const double ratio = static_cast<double>(activation_element_bytes(precision)) /
                       activation_element_bytes(profile.precision);
  for (LayerProfile& layer : profile.layers) {
    for (double* bytes :
         {&layer.activation_bytes, &layer.stash_bytes, &layer.weight_stash_bytes,
          &layer.forward_transient_bytes, &layer.backward_transient_bytes, &layer.stash_fixed_bytes,
          &layer.forward_transient_fixed_bytes, &layer.backward_transient_fixed_bytes}) {
      if (*bytes > 0) *bytes *= ratio;  // < 0: not measured, left so
    }
  }
  profile.precision = precision;
  return profile;
}

Profile read_profile(const std::string& path) {
  const std::string text = read_text_file(path, "profile");
  size_t first = text.find_first_not_of(" \t\r\n");
  PPTRAIN_CHECK(first != std::string::npos, path,
                ": empty file; expected a pptrain JSON profile or a PipeDream graph.txt");
  return text[first] == '{' ? parse_profile_json(text, path) : parse_pipedream_graph(text, path);
}

}  // namespace pptrain
