#include "pptrain/runtime/cluster_env.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/testing.h"

namespace pptrain {
namespace {

using testing::user_error_of;

using Hosts = std::vector<std::string>;

TEST(HostList, ExpandsSlurmsCompressedSyntaxKeepingZeroPadding) {
  EXPECT_EQ(expand_host_list("node[01-04,07]"),
            (Hosts{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_host_list("a[1-2],b3"), (Hosts{"a1", "a2", "b3"}));
  EXPECT_EQ(expand_host_list("single"), (Hosts{"single"}));
  EXPECT_EQ(expand_host_list("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_host_list("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_host_list("gpu-[1-2]-ib"), (Hosts{"gpu-1-ib", "gpu-2-ib"}));
  EXPECT_EQ(expand_host_list("r[1-2]n[1,3]"), (Hosts{"r1n1", "r1n3", "r2n1", "r2n3"}));
  EXPECT_EQ(expand_host_list("x.example.org,y[5]"), (Hosts{"x.example.org", "y5"}));
}

TEST(HostList, BadInputIsOneLineNamingTheList) {
  for (const std::string bad :
       {"", "node[1-", "node1]", "node[]", "node[3-1]", "node[a-b]", "node[1,,2]", ",node1",
        "node1,", "node[1-2", "no de1", "node[[1]]", "[1-2]", "n[0-99999999]", "n[1-2-3]"}) {
    const std::string message = user_error_of([&] { expand_host_list(bad); });
    EXPECT_FALSE(message.empty()) << "accepted '" << bad << "'";
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(user_error_of([] { expand_host_list("node[3-1]"); }).find("ends below its start"),
            std::string::npos);
}

TEST(ClusterEnv, NothingSetIsAWorldOfOne) {
  const ClusterEnv env = detect_cluster_env({{"HOME", "/root"}});
  EXPECT_EQ(env.launcher, Launcher::kNone);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(is_launched_rank(env));
}

TEST(ClusterEnv, TorchrunsVariables) {
  const ClusterEnv env = detect_cluster_env({{"RANK", "3"},
                                             {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "1"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.1"},
                                             {"MASTER_PORT", "29500"},
                                             {"SLURM_PROCID", "0"},
                                             {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);  // RANK first, whatever else is set
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(is_launched_rank(env));
  EXPECT_NE(user_error_of([] {
              detect_cluster_env(
                  {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
            }).find("RANK=2 is not below WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              detect_cluster_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
            }).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(
      user_error_of([] {
        detect_cluster_env(
            {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
      }).find("not a TCP port"),
      std::string::npos);
}

Environment srun(const std::string& procid, const std::string& nodelist) {
  return {{"SLURM_PROCID", procid},      {"SLURM_NTASKS", "4"},    {"SLURM_LOCALID", "1"},
          {"SLURM_STEP_ID", "0"},        {"SLURM_JOB_ID", "4242"}, {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_NTASKS_PER_NODE", "2"}};
}

TEST(ClusterEnv, SrunsVariables) {
  const ClusterEnv env = detect_cluster_env(srun("3", "node[07-08]"));
  EXPECT_EQ(env.launcher, Launcher::kSlurm);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node07");
  EXPECT_EQ(env.master_port, slurm_job_port("4242"));
  EXPECT_EQ(env.addr_from, "first host of SLURM_JOB_NODELIST");
  EXPECT_EQ(env.port_from, "SLURM_JOB_ID");
  EXPECT_EQ(describe_cluster_env(env),
            "slurm: rank 3 of 4, master node07:" + std::to_string(slurm_job_port("4242")) +
                " (first host of SLURM_JOB_NODELIST, port from SLURM_JOB_ID)");

  Environment with_master = srun("0", "node[07-08]");
  with_master["MASTER_ADDR"] = "10.1.1.1";
  with_master["MASTER_PORT"] = "23456";
  const ClusterEnv given = detect_cluster_env(with_master);
  EXPECT_EQ(given.master_addr, "10.1.1.1");
  EXPECT_EQ(given.master_port, 23456);
  // The command line beats the environment.
  EXPECT_EQ(detect_cluster_env(with_master, {"h2", 3000}).master_addr, "h2");
  EXPECT_EQ(detect_cluster_env(with_master, {"h2", 3000}).master_port, 3000);
}

TEST(ClusterEnv, SlurmPortsStayBelowTheEphemeralRangeAndDifferByJob) {
  for (const std::string job : {"0", "1", "19999", "20000", "987654321", "12_3"}) {
    EXPECT_GE(slurm_job_port(job), 12000);
    EXPECT_LT(slurm_job_port(job), 32000);
  }
  EXPECT_NE(slurm_job_port("100"), slurm_job_port("101"));
  EXPECT_EQ(slurm_job_port("100"), slurm_job_port("100"));
}

TEST(ClusterEnv, ABatchScriptOrOneTaskIsNoRank) {
  Environment batch = srun("0", "node[07-08]");
  batch.erase("SLURM_STEP_ID");  // sbatch's script itself: no step
  EXPECT_EQ(detect_cluster_env(batch).launcher, Launcher::kNone);
  Environment one = srun("0", "node07");
  one["SLURM_NTASKS"] = "1";
  one["SLURM_NTASKS_PER_NODE"] = "1";
  one["SLURM_LOCALID"] = "0";
  EXPECT_EQ(detect_cluster_env(one).launcher, Launcher::kNone);
}

TEST(ClusterEnv, ABadSlurmNodeListIsOneLineNamingTheVariable) {
  const std::string message = user_error_of([] { detect_cluster_env(srun("0", "node[01-")); });
  EXPECT_NE(message.find("SLURM_JOB_NODELIST: host list 'node[01-'"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_NE(user_error_of([] {
              detect_cluster_env(srun("4", "n1"));
            }).find("SLURM_PROCID=4 is not below SLURM_NTASKS=4"),
            std::string::npos);
}

TEST(ClusterEnv, OpenMpisVariables) {
  const Environment one_host = {{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  const ClusterEnv env = detect_cluster_env(one_host);
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");  // every rank on this host
  EXPECT_EQ(env.master_port, 29500);

  Environment two_hosts = one_host;
  two_hosts["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1";
  two_hosts["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  EXPECT_NE(user_error_of([&] { detect_cluster_env(two_hosts); }).find("set MASTER_ADDR"),
            std::string::npos);
  EXPECT_EQ(detect_cluster_env(two_hosts, {"node01", 0}).master_addr, "node01");
  two_hosts["MASTER_ADDR"] = "node02";
  two_hosts["MASTER_PORT"] = "23000";
  EXPECT_EQ(detect_cluster_env(two_hosts).master_addr, "node02");
  EXPECT_EQ(detect_cluster_env(two_hosts).master_port, 23000);
}

TEST(ClusterEnv, MpichsVariables) {
  const ClusterEnv env = detect_cluster_env({{"PMI_RANK", "2"},
                                             {"PMI_SIZE", "3"},
                                             {"MPI_LOCALRANKID", "2"},
                                             {"MPI_LOCALNRANKS", "3"},
                                             {"MASTER_PORT", "24000"}});
  EXPECT_EQ(env.launcher, Launcher::kMpich);
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 24000);
  EXPECT_NE(user_error_of([] {
              detect_cluster_env({{"PMI_RANK", "0"}, {"PMI_SIZE", "x"}});
            }).find("PMI_SIZE='x' is not a non-negative integer"),
            std::string::npos);
}

TEST(NodeGroup, TorchrunsFlagsResolved) {
  NodeGroupOptions flags;
  EXPECT_FALSE(resolve_node_group(flags).multi_node());
  flags.nnodes = "2";
  flags.node_rank = 1;
  flags.master_addr = "10.0.0.1";
  NodeGroup group = resolve_node_group(flags);
  EXPECT_TRUE(group.multi_node());
  EXPECT_EQ(group.master_port, 29500);
  EXPECT_EQ(group.node_rank, 1);

  flags = {};
  flags.nnodes = "1:3";
  flags.rdzv_backend = "c10d";
  flags.rdzv_endpoint = "head:1234";
  flags.rdzv_id = "job1";
  flags.rdzv_conf = "join_timeout=5,last_call_timeout=2";
  group = resolve_node_group(flags);
  EXPECT_TRUE(group.dynamic);
  EXPECT_EQ(group.min_nodes, 1);
  EXPECT_EQ(group.max_nodes, 3);
  EXPECT_EQ(group.endpoint_host, "head");
  EXPECT_EQ(group.endpoint_port, 1234);
  EXPECT_EQ(group.join_timeout_s, 5);
  EXPECT_EQ(group.last_call_timeout_s, 2);
  flags.rdzv_endpoint = "head";
  EXPECT_EQ(resolve_node_group(flags).endpoint_port, 29400);
}

TEST(NodeGroup, BadFlagsAreOneLineEach) {
  const auto message = [](NodeGroupOptions flags) {
    return user_error_of([&] { resolve_node_group(flags); });
  };
  NodeGroupOptions flags;
  flags.nnodes = "2";
  flags.node_rank = 2;
  EXPECT_NE(message(flags).find("--node-rank 2 is not below --nnodes 2"), std::string::npos);
  flags = {};
  flags.nnodes = "3:2";
  flags.rdzv_backend = "c10d";
  flags.rdzv_endpoint = "h:1";
  EXPECT_NE(message(flags).find("MIN 3 is above MAX 2"), std::string::npos);
  flags = {};
  flags.nnodes = "2";
  flags.rdzv_backend = "c10d";
  EXPECT_NE(message(flags).find("needs --rdzv-endpoint"), std::string::npos);
  flags = {};
  flags.nnodes = "1:2";
  EXPECT_NE(message(flags).find("needs --rdzv-backend c10d"), std::string::npos);
  for (const std::string nnodes : {"0", "x", "2:", ":2", "1:2:3", "-1", "2000"}) {
    flags = {};
    flags.nnodes = nnodes;
    EXPECT_NE(message(flags).find("--nnodes"), std::string::npos) << nnodes;
  }
  flags = {};
  flags.rdzv_backend = "etcd";
  EXPECT_NE(message(flags).find("not static or c10d"), std::string::npos);
  flags = {};
  flags.rdzv_backend = "c10d";
  flags.rdzv_endpoint = "h:99999";
  EXPECT_NE(message(flags).find("not a TCP port"), std::string::npos);
  flags.rdzv_endpoint = "h:1";
  flags.rdzv_conf = "timeout=3";
  EXPECT_NE(message(flags).find("unknown key 'timeout'"), std::string::npos);
}

TEST(NodeGroup, WorkersGetTorchrunsVariables) {
  NodeAssignment node;
  node.node_rank = 1;
  node.nnodes = 2;
  node.first_rank = 2;
  node.world_size = 4;
  node.master_addr = "10.0.0.1";
  node.master_port = 29500;
  node.run_id = "job1";
  const Environment env = torchrun_variables(node, 1, 2, 3, 5);
  EXPECT_EQ(env.at("RANK"), "3");
  EXPECT_EQ(env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env.at("GROUP_RANK"), "1");
  EXPECT_EQ(env.at("ROLE_RANK"), "3");
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "3");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "5");
  EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "job1");
  // What a rank of them detects is what the launcher meant.
  const ClusterEnv seen = detect_cluster_env(env);
  EXPECT_EQ(seen.rank, 3);
  EXPECT_EQ(seen.world_size, 4);
  EXPECT_EQ(seen.local_rank, 1);
  EXPECT_EQ(seen.master_addr, "10.0.0.1");
  EXPECT_EQ(seen.restart_count, 3);
  // A node that came late to the others' fourth meeting starts its ranks in the run's count, not
  // in its own agent's (0): their metrics and checkpoints are the run's fourth start's.
  node.round = 4;
  EXPECT_EQ(torchrun_variables(node, 1, 2, 0, 5).at("TORCHELASTIC_RESTART_COUNT"), "4");
  EXPECT_EQ(detect_cluster_env(torchrun_variables(node, 1, 2, 0, 5)).restart_count, 4);
}

}  // namespace
}  // namespace pptrain
