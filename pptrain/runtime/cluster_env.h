// Which launcher started this process and what it says about the run: the one place pptrain
// reads a rank's environment (torchrun's variables, Slurm's srun, OpenMPI's and MPICH's
// mpirun), and the one place that writes torchrun's variables for the ranks pptrain starts.
// Everything here but process_environment() and cluster_env_of_process() is a pure function of
// its arguments, unit-tested in cluster_env_test.cpp.
//
//   const ClusterEnv env = detect_cluster_env(process_environment());
//   if (env.launcher == Launcher::kNone) ...;    // a world of one process
//   env.rank, env.world_size, env.master_addr, env.master_port
//
// Precedence: RANK set means torchrun's variables (torchrun, `pptrain run`, pptrain's own
// workers, a Kubernetes PyTorchJob), whatever else is set; else a Slurm job step (srun:
// SLURM_PROCID and SLURM_STEP_ID; a batch script itself has no step id and is not a rank); else
// OpenMPI (OMPI_COMM_WORLD_RANK) or MPICH/Hydra (PMI_RANK). A Slurm step or MPI job of one task is
// a world of one process (Launcher::kNone), so `pptrain train` there starts its own workers.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pptrain {

using Environment = std::map<std::string, std::string>;

// This process's environment variables.
Environment process_environment();

enum class Launcher { kNone, kTorchrun, kSlurm, kOpenMpi, kMpich };

// "torchrun", "slurm", "openmpi", "mpich" (or "none").
const char* launcher_name(Launcher launcher);

// This process among the ranks of a run, as its launcher describes it.
struct ClusterEnv {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // where rank 0 serves the rendezvous store
  int master_port = 0;
  // Where master_addr and master_port came from, for the line that names the launcher:
  // "MASTER_ADDR", "first host of SLURM_JOB_NODELIST", "--master-addr", ...
  std::string addr_from;
  std::string port_from;
  // How many times the launcher started this rank's group again (TORCHELASTIC_RESTART_COUNT;
  // 0 on the first start and under Slurm or MPI).
  int restart_count = 0;
};

// What the command line says of the master, which beats the environment (pptrain train
// --master-addr under mpirun). Empty / 0: not given.
struct MasterHint {
  std::string addr;
  int port = 0;
};

// The run described by `env` (see above). UserError, one line naming the variable, for a
// malformed one: a rank not below the size, a node list that is not Slurm's syntax, an MPI
// job on several hosts without MASTER_ADDR (or --master-addr), ...
ClusterEnv detect_cluster_env(const Environment& env, const MasterHint& hint = {});

// detect_cluster_env() of this process. The first time it finds Slurm or MPI, it says so on
// stderr (rank 0 only, one line: describe_cluster_env()) and exports torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) into the
// environment, so that what reads them later (error lines' "rank R: ", child processes) agrees.
ClusterEnv cluster_env_of_process(const MasterHint& hint = {});

// True when this process is one rank of a multi-process run someone else started.
bool is_launched_rank(const ClusterEnv& env);

// "slurm: rank 0 of 4, master node01:17042 (first host of SLURM_JOB_NODELIST, port from
// SLURM_JOB_ID)".
std::string describe_cluster_env(const ClusterEnv& env);

// Slurm's compressed host list ("node[01-04,07]", "a[1-2],b3", "gpu-[1-2]-ib") expanded in
// order, zero padding kept: node01 node02 node03 node04 node07. UserError (one line quoting
// the list) for unbalanced brackets, an empty name or range, a range whose end is below its
// start, or more than kMaxHosts names.
std::vector<std::string> expand_host_list(const std::string& list);
constexpr int kMaxHosts = 1 << 20;

// The port a Slurm job's ranks meet at when MASTER_PORT is not set: the same on every node of
// the job, below the kernel's ephemeral range, different for neighbouring job ids.
int slurm_job_port(const std::string& job_id);

// --- torchrun's flags, as `pptrain run` and `pptrain train` take them -------------------------

// The nodes of a run as given on the command line (torchrun's spellings).
struct NodeGroupOptions {
  std::string nnodes = "1";      // "N" or "MIN:MAX" (c10d rendezvous)
  int nproc_per_node = 0;        // 0: the command's default
  int node_rank = 0;             // static rendezvous
  std::string master_addr;       // static: rank 0's host; empty = 127.0.0.1
  int master_port = 0;           // static: 0 = a free port on one node, 29500 on several
  std::string rdzv_backend;      // "" or "static", or "c10d"
  std::string rdzv_endpoint;     // c10d: HOST[:PORT], the node agents' store
  std::string rdzv_id = "none";  // TORCHELASTIC_RUN_ID; c10d: the agents of one run share it
  std::string rdzv_conf;         // "join_timeout=S,last_call_timeout=S"
  int max_restarts = 0;
};

// NodeGroupOptions checked and resolved.
struct NodeGroup {
  int min_nodes = 1;
  int max_nodes = 1;
  bool dynamic = false;  // c10d rendezvous
  int node_rank = 0;     // static only; dynamic: given by the rendezvous
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free one (one node, static)
  std::string endpoint_host;
  int endpoint_port = 29400;
  std::string run_id = "none";
  int join_timeout_s = 600;      // c10d: how long an agent waits for the others
  int last_call_timeout_s = 30;  // c10d, MIN < MAX: how long the rendezvous waits past MIN
  bool multi_node() const { return dynamic || max_nodes > 1; }
};

// UserError, one line each, for: nnodes not N or MIN:MAX with 1 <= MIN <= MAX, --node-rank not
// below --nnodes, MIN:MAX without --rdzv-backend c10d, c10d without --rdzv-endpoint, an
// endpoint that is not HOST[:PORT], an unknown backend or --rdzv-conf key.
NodeGroup resolve_node_group(const NodeGroupOptions& options);

// "N" or "MIN:MAX" -> {MIN, MAX} (see resolve_node_group).
std::pair<int, int> parse_nnodes(const std::string& text);

// A node agent met in a c10d rendezvous, as the others know it.
struct NodeMember {
  std::string host;       // its host name
  std::string address;    // its address towards the endpoint
  int presence_port = 0;  // where its agent listens while it lives (rendezvous.h)
  int nproc = 0;          // its ranks
  bool operator==(const NodeMember& other) const {
    return address == other.address && presence_port == other.presence_port;
  }
};

// A node's place in the run: what a rendezvous gives an agent.
struct NodeAssignment {
  int node_rank = 0;
  int nnodes = 1;
  int first_rank = 0;  // the global rank of this node's local rank 0
  int world_size = 1;  // ranks over all nodes
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string run_id = "none";
  // The c10d rendezvous's round this node met the others in: its own restart count, or the
  // others' later one when it came late (0 for a static one).
  int round = 0;
  // c10d: the nodes that met, by node rank; and the nodes of the meeting before that did not
  // come again because their agents are gone, one "node 2 (host n3, 10.0.0.3)" each.
  std::vector<NodeMember> members;
  std::vector<std::string> lost;
};

// The variables torchrun gives local rank `local_rank` of `nproc` on the node `node`, in its
// `restart_count`-th start (or in the others' later round when the node came late: a rank counts
// the run's restarts, whatever its own agent's count): RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, GROUP_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_MAX_RESTARTS.
Environment torchrun_variables(const NodeAssignment& node, int local_rank, int nproc,
                               int restart_count, int max_restarts);

}  // namespace pptrain
