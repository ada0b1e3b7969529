#include "pptrain/runtime/cluster_env.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"

extern char** environ;

namespace pptrain {
namespace {

constexpr int kTorchrunPort = 29500;

const std::string* find(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// A whole number 0 <= value < 2^30, or -1.
long whole_number(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stol(text);
}

// Variable `name` of `env` as a whole number; `fallback` when it is not set and fallback >= 0.
int env_number(const Environment& env, const char* name, int fallback = -1,
               const char* launcher = "torchrun") {
  const std::string* text = find(env, name);
  PPTRAIN_CHECK(text || fallback >= 0, "environment variable ", name, " is not set (expected as ",
                launcher, " sets it)");
  if (!text) return fallback;
  const long value = whole_number(*text);
  PPTRAIN_CHECK(value >= 0, "environment variable ", name, "='", *text,
                "' is not a non-negative integer");
  return static_cast<int>(value);
}

int checked_port(const std::string& text, const std::string& what) {
  const long port = whole_number(text);
  PPTRAIN_CHECK(port > 0 && port < 65536, what, "='", text, "' is not a TCP port (1..65535)");
  return static_cast<int>(port);
}

// Where rank 0 is: --master-addr, MASTER_ADDR, else `fallback` (with its origin), else an error
// that says what to set. The same for the port.
void find_master(const Environment& env, const MasterHint& hint, const std::string& fallback_addr,
                 const std::string& addr_origin, int fallback_port, const std::string& port_origin,
                 const std::string& missing_addr, ClusterEnv& out) {
  if (!hint.addr.empty()) {
    out.master_addr = hint.addr;
    out.addr_from = "--master-addr";
  } else if (const std::string* addr = find(env, "MASTER_ADDR")) {
    out.master_addr = *addr;
    out.addr_from = "MASTER_ADDR";
  } else {
    PPTRAIN_CHECK(!fallback_addr.empty(), missing_addr);
    out.master_addr = fallback_addr;
    out.addr_from = addr_origin;
  }
  if (hint.port > 0) {
    out.master_port = hint.port;
    out.port_from = "--master-port";
  } else if (const std::string* port = find(env, "MASTER_PORT")) {
    out.master_port = checked_port(*port, "MASTER_PORT");
    out.port_from = "MASTER_PORT";
  } else {
    PPTRAIN_CHECK(fallback_port > 0,
                  "environment variable MASTER_PORT is not set (expected as torchrun sets it: "
                  "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    out.master_port = fallback_port;
    out.port_from = port_origin;
  }
}

void check_rank(const ClusterEnv& env, const char* rank_name, const char* size_name) {
  PPTRAIN_CHECK(env.world_size >= 1 && env.rank < env.world_size, rank_name, "=", env.rank,
                " is not below ", size_name, "=", env.world_size);
  PPTRAIN_CHECK(env.local_world_size >= 1 && env.local_rank < env.local_world_size,
                "the local rank ", env.local_rank, " is not below the local size ",
                env.local_world_size);
}

ClusterEnv torchrun_env(const Environment& env, const MasterHint& hint) {
  ClusterEnv out;
  out.launcher = Launcher::kTorchrun;
  out.rank = env_number(env, "RANK");
  out.world_size = env_number(env, "WORLD_SIZE");
  out.local_rank = env_number(env, "LOCAL_RANK", out.rank);
  out.local_world_size = env_number(env, "LOCAL_WORLD_SIZE", std::max(out.world_size, 1));
  out.restart_count = env_number(env, "TORCHELASTIC_RESTART_COUNT", 0);
  check_rank(out, "RANK", "WORLD_SIZE");
  find_master(env, hint, "", "", 0, "", "environment variable MASTER_ADDR is not set", out);
  return out;
}

ClusterEnv slurm_env(const Environment& env, const MasterHint& hint) {
  ClusterEnv out;
  out.launcher = Launcher::kSlurm;
  out.rank = env_number(env, "SLURM_PROCID", -1, "srun");
  out.world_size = env_number(env, "SLURM_NTASKS", -1, "srun");
  out.local_rank = env_number(env, "SLURM_LOCALID", 0, "srun");
  // SLURM_STEP_TASKS_PER_NODE ("2(x3),1") would say the node's own count only with the node's
  // index; a CPU rank needs no more than its local rank.
  out.local_world_size =
      env_number(env, "SLURM_NTASKS_PER_NODE", std::max(out.world_size, 1), "srun");
  check_rank(out, "SLURM_PROCID", "SLURM_NTASKS");
  // Rank 0 runs on the first node of the step (srun places tasks in node-list order).
  std::string first_host, list_name;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const std::string* list = find(env, name)) {
      list_name = name;
      try {
        first_host = expand_host_list(*list).front();
      } catch (const UserError& e) {
        throw UserError(std::string(name) + ": " + e.what());
      }
      break;
    }
  }
  int port = 0;
  std::string port_origin;
  if (const std::string* job = find(env, "SLURM_JOB_ID")) {
    port = slurm_job_port(*job);
    port_origin = "SLURM_JOB_ID";
  }
  find_master(env, hint, first_host, "first host of " + list_name, port, port_origin,
              "srun gave no SLURM_JOB_NODELIST: set MASTER_ADDR or give --master-addr", out);
  return out;
}

ClusterEnv mpi_env(const Environment& env, const MasterHint& hint, bool openmpi) {
  ClusterEnv out;
  out.launcher = openmpi ? Launcher::kOpenMpi : Launcher::kMpich;
  const char* launcher = openmpi ? "OpenMPI's mpirun" : "MPICH's mpirun";
  const char* rank_name = openmpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char* size_name = openmpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char* local_name = openmpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID";
  const char* local_size_name = openmpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  out.rank = env_number(env, rank_name, -1, launcher);
  out.world_size = env_number(env, size_name, -1, launcher);
  // Without the local variables (an older MPICH), a rank's node is not known: say one host only
  // when the job says so.
  out.local_rank = env_number(env, local_name, out.rank, launcher);
  const int local_size = env_number(env, local_size_name, 0, launcher);
  out.local_world_size = local_size > 0 ? local_size : std::max(out.world_size, 1);
  check_rank(out, rank_name, size_name);
  const bool one_host = local_size == out.world_size;
  find_master(env, hint, one_host ? "127.0.0.1" : "", "all ranks on this host", kTorchrunPort,
              "torchrun's default",
              std::string(launcher) + " on several hosts: set MASTER_ADDR to rank 0's host " +
                  "(mpirun -x MASTER_ADDR=HOST) or give --master-addr",
              out);
  return out;
}

void append_checked(std::vector<std::string>& hosts, std::string host, const std::string& list) {
  PPTRAIN_CHECK(static_cast<int>(hosts.size()) < kMaxHosts, "host list '", list,
                "' names more than ", kMaxHosts, " hosts");
  hosts.push_back(std::move(host));
}

// Expands one item of a host list ("node[01-03]x[1,2]" has two bracket groups) onto `hosts`.
void expand_item(const std::string& item, const std::string& list,
                 std::vector<std::string>& hosts) {
  const auto bad = [&list](const std::string& why) {
    throw UserError("host list '" + list +
                    "' is not Slurm's syntax (e.g. node[01-04,07],b3): " + why);
  };
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) bad("']' without '['");
    append_checked(hosts, item, list);
    return;
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) bad("'[' without ']'");
  if (item.find('[', open + 1) < close) bad("nested '['");
  const std::string prefix = item.substr(0, open);
  const std::string body = item.substr(open + 1, close - open - 1);
  const std::string rest = item.substr(close + 1);
  if (body.empty()) bad("empty brackets");
  size_t start = 0;
  while (start <= body.size()) {
    const size_t comma = std::min(body.find(',', start), body.size());
    const std::string range = body.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string low = range.substr(0, dash);
    const std::string high = dash == std::string::npos ? low : range.substr(dash + 1);
    const long from = whole_number(low), to = whole_number(high);
    if (range.empty()) bad("an empty range");
    if (from < 0 || to < 0) bad("'" + range + "' is not N or N-M");
    if (to < from) bad("the range '" + range + "' ends below its start");
    if (to - from >= kMaxHosts || static_cast<long>(hosts.size()) + (to - from) >= kMaxHosts)
      bad("more than " + std::to_string(kMaxHosts) + " hosts");
    for (long n = from; n <= to; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < low.size()) number.insert(0, low.size() - number.size(), '0');
      expand_item(prefix + number + rest, list, hosts);
    }
    start = comma + 1;
  }
}

}  // namespace

Environment process_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals != std::string::npos) env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return env;
}

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kSlurm:
      return "slurm";
    case Launcher::kOpenMpi:
      return "openmpi";
    case Launcher::kMpich:
      return "mpich";
    case Launcher::kNone:
      break;
  }
  return "none";
}

ClusterEnv detect_cluster_env(const Environment& env, const MasterHint& hint) {
  ClusterEnv found;
  if (find(env, "RANK")) {
    return torchrun_env(env, hint);
  } else if (find(env, "SLURM_PROCID") &&
             (find(env, "SLURM_STEP_ID") || find(env, "SLURM_STEPID"))) {
    found = slurm_env(env, hint);
  } else if (find(env, "OMPI_COMM_WORLD_RANK")) {
    found = mpi_env(env, hint, /*openmpi=*/true);
  } else if (find(env, "PMI_RANK")) {
    found = mpi_env(env, hint, /*openmpi=*/false);
  }
  // One task is a world of one process, whoever started it.
  return found.world_size > 1 ? found : ClusterEnv{};
}

bool is_launched_rank(const ClusterEnv& env) {
  return env.launcher != Launcher::kNone;
}

std::string describe_cluster_env(const ClusterEnv& env) {
  std::string line = std::string(launcher_name(env.launcher)) + ": rank " +
                     std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                     ", master " + env.master_addr + ":" + std::to_string(env.master_port);
  if (!env.addr_from.empty()) line += " (" + env.addr_from + ", port from " + env.port_from + ")";
  return line;
}

ClusterEnv cluster_env_of_process(const MasterHint& hint) {
  const ClusterEnv env = detect_cluster_env(process_environment(), hint);
  if (env.launcher == Launcher::kNone || env.launcher == Launcher::kTorchrun) return env;
  static std::once_flag said;
  std::call_once(said, [&env] {
    if (env.rank == 0) {
      std::fprintf(stderr, "pptrain: launcher found: %s\n", describe_cluster_env(env).c_str());
      std::fflush(stderr);
    }
  });
  const Environment ours = {
      {"RANK", std::to_string(env.rank)},
      {"WORLD_SIZE", std::to_string(env.world_size)},
      {"LOCAL_RANK", std::to_string(env.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(env.local_world_size)},
      {"MASTER_ADDR", env.master_addr},
      {"MASTER_PORT", std::to_string(env.master_port)},
  };
  for (const auto& [name, value] : ours) setenv(name.c_str(), value.c_str(), 1);
  return env;
}

std::vector<std::string> expand_host_list(const std::string& list) {
  PPTRAIN_CHECK(!list.empty(), "the host list is empty");
  for (const char c : list) {
    const bool fits = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                      c == '.' || c == '[' || c == ']' || c == ',';
    PPTRAIN_CHECK(fits, "host list '", list, "' is not Slurm's syntax (e.g. node[01-04,07],b3): '",
                  std::string(1, c), "' in a host name");
  }
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (i < list.size() && (list[i] != ',' || depth > 0)) continue;
    const std::string item = list.substr(start, i - start);
    PPTRAIN_CHECK(!item.empty() && item.front() != '[', "host list '", list,
                  "' is not Slurm's syntax (e.g. node[01-04,07],b3): an empty host name");
    expand_item(item, list, hosts);
    start = i + 1;
  }
  return hosts;
}

int slurm_job_port(const std::string& job_id) {
  const long number = whole_number(job_id);
  const size_t key = number >= 0 ? static_cast<size_t>(number) : std::hash<std::string>()(job_id);
  return 12000 + static_cast<int>(key % 20000);  // 12000..31999: below 32768, the ephemeral start
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  const size_t colon = text.find(':');
  const long min = whole_number(text.substr(0, colon));
  const long max = colon == std::string::npos ? min : whole_number(text.substr(colon + 1));
  PPTRAIN_CHECK(min >= 1 && max >= 1 && max <= 1024, "--nnodes '", text,
                "' is not N or MIN:MAX with whole numbers 1..1024");
  PPTRAIN_CHECK(min <= max, "--nnodes ", text, ": MIN ", min, " is above MAX ", max);
  return {static_cast<int>(min), static_cast<int>(max)};
}

NodeGroup resolve_node_group(const NodeGroupOptions& options) {
  NodeGroup group;
  std::tie(group.min_nodes, group.max_nodes) = parse_nnodes(options.nnodes);
  PPTRAIN_CHECK(options.rdzv_backend.empty() || options.rdzv_backend == "static" ||
                    options.rdzv_backend == "c10d",
                "--rdzv-backend '", options.rdzv_backend, "' is not static or c10d");
  group.dynamic = options.rdzv_backend == "c10d";
  group.run_id = options.rdzv_id.empty() ? "none" : options.rdzv_id;
  PPTRAIN_CHECK(options.max_restarts >= 0, "--max-restarts must be >= 0, got ",
                options.max_restarts);
  if (group.dynamic) {
    PPTRAIN_CHECK(!options.rdzv_endpoint.empty(),
                  "--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT (where the node agents "
                  "meet)");
    const std::string& endpoint = options.rdzv_endpoint;
    const size_t colon = endpoint.rfind(':');
    group.endpoint_host = endpoint.substr(0, colon);
    if (colon != std::string::npos) {
      group.endpoint_port = checked_port(endpoint.substr(colon + 1), "--rdzv-endpoint port");
    }
    PPTRAIN_CHECK(!group.endpoint_host.empty() &&
                      group.endpoint_host.find_first_of(" /[]") == std::string::npos,
                  "--rdzv-endpoint '", endpoint, "' is not HOST[:PORT]");
    PPTRAIN_CHECK(options.node_rank == 0 || options.node_rank < group.max_nodes, "--node-rank ",
                  options.node_rank, " is not below --nnodes ", options.nnodes);
  } else {
    PPTRAIN_CHECK(group.min_nodes == group.max_nodes, "--nnodes ", options.nnodes,
                  ": a range of nodes needs --rdzv-backend c10d --rdzv-endpoint HOST:PORT");
    PPTRAIN_CHECK(options.rdzv_endpoint.empty(),
                  "--rdzv-endpoint is for --rdzv-backend c10d (static: --master-addr, "
                  "--master-port)");
    PPTRAIN_CHECK(options.node_rank >= 0 && options.node_rank < group.max_nodes, "--node-rank ",
                  options.node_rank, " is not below --nnodes ", group.max_nodes);
    group.node_rank = options.node_rank;
    if (!options.master_addr.empty()) group.master_addr = options.master_addr;
    group.master_port = options.master_port;
    if (group.master_port == 0 && group.max_nodes > 1) group.master_port = kTorchrunPort;
  }
  PPTRAIN_CHECK(options.master_port >= 0 && options.master_port < 65536, "--master-port ",
                options.master_port, " is not a TCP port (1..65535)");
  // torchrun's --rdzv-conf: comma-separated KEY=VALUE.
  const std::string& conf = options.rdzv_conf;
  for (size_t start = 0; start < conf.size();) {
    const size_t comma = std::min(conf.find(',', start), conf.size());
    const std::string pair = conf.substr(start, comma - start);
    const size_t equals = pair.find('=');
    const std::string key = pair.substr(0, equals);
    const long value = equals == std::string::npos ? -1 : whole_number(pair.substr(equals + 1));
    PPTRAIN_CHECK(value >= 1, "--rdzv-conf '", pair, "' is not KEY=SECONDS");
    if (key == "join_timeout") {
      group.join_timeout_s = static_cast<int>(value);
    } else if (key == "last_call_timeout") {
      group.last_call_timeout_s = static_cast<int>(value);
    } else {
      throw UserError("--rdzv-conf: unknown key '" + key +
                      "' (known: join_timeout, last_call_timeout)");
    }
    start = comma + 1;
  }
  return group;
}

Environment torchrun_variables(const NodeAssignment& node, int local_rank, int nproc,
                               int restart_count, int max_restarts) {
  const std::string rank = std::to_string(node.first_rank + local_rank);
  const std::string world = std::to_string(node.world_size);
  return {
      {"RANK", rank},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(node.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(node.nnodes)},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", node.master_addr},
      {"MASTER_PORT", std::to_string(node.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(std::max(restart_count, node.round))},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
      {"TORCHELASTIC_RUN_ID", node.run_id},
  };
}

}  // namespace pptrain
