#include "pptrain/runtime/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "pptrain/runtime/launcher.h"

namespace pptrain {
namespace {

NodeGroup c10d_group(const std::string& nnodes, int port, const std::string& conf) {
  NodeGroupOptions flags;
  flags.nnodes = nnodes;
  flags.rdzv_backend = "c10d";
  flags.rdzv_endpoint = "127.0.0.1:" + std::to_string(port);
  flags.rdzv_id = "test";
  flags.rdzv_conf = conf;
  return resolve_node_group(flags);
}

TEST(Rendezvous, StaticPlacesANodeByItsRank) {
  NodeGroupOptions flags;
  flags.nnodes = "3";
  flags.node_rank = 2;
  flags.master_addr = "10.0.0.1";
  const NodeAssignment node = static_assignment(resolve_node_group(flags), 4);
  EXPECT_EQ(node.node_rank, 2);
  EXPECT_EQ(node.nnodes, 3);
  EXPECT_EQ(node.first_rank, 8);
  EXPECT_EQ(node.world_size, 12);
  EXPECT_EQ(node.master_addr, "10.0.0.1");
  EXPECT_EQ(node.master_port, 29500);
  EXPECT_EQ(describe_node(node, 4), "node 2 of 3 (ranks 8-11 of 12), master 10.0.0.1:29500");
}

// Three agents meet at one endpoint (one serves the store): distinct node ranks, ranks that
// follow one another (nodes of 1, 2 and 3 ranks), one master.
TEST(Rendezvous, C10dAgentsGetDistinctNodeRanksAndOneMaster) {
  const NodeGroup group = c10d_group("3", find_free_port(), "join_timeout=60");
  std::vector<std::future<NodeAssignment>> agents;
  for (int nproc = 1; nproc <= 3; ++nproc) {
    agents.push_back(std::async(std::launch::async,
                                [&group, nproc] { return c10d_rendezvous(group, nproc, 0); }));
  }
  std::vector<NodeAssignment> nodes;
  for (auto& agent : agents) nodes.push_back(agent.get());
  std::vector<int> node_ranks;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int nproc = static_cast<int>(i) + 1;
    node_ranks.push_back(nodes[i].node_rank);
    EXPECT_EQ(nodes[i].nnodes, 3);
    EXPECT_EQ(nodes[i].world_size, 6);
    EXPECT_EQ(nodes[i].master_addr, nodes[0].master_addr);
    EXPECT_EQ(nodes[i].master_port, nodes[0].master_port);
    EXPECT_EQ(nodes[i].run_id, "test");
    // The ranks of the nodes before this one come first.
    int before = 0;
    for (size_t j = 0; j < nodes.size(); ++j) {
      if (nodes[j].node_rank < nodes[i].node_rank) before += static_cast<int>(j) + 1;
    }
    EXPECT_EQ(nodes[i].first_rank, before) << "an agent of " << nproc << " ranks";
  }
  std::sort(node_ranks.begin(), node_ranks.end());
  EXPECT_EQ(node_ranks, (std::vector<int>{0, 1, 2}));
}

// MIN:MAX closes at MIN nodes once the last call has passed.
TEST(Rendezvous, C10dClosesAtMinAfterTheLastCall) {
  const NodeGroup group =
      c10d_group("2:4", find_free_port(), "join_timeout=60,last_call_timeout=1");
  auto first = std::async(std::launch::async, [&group] { return c10d_rendezvous(group, 1, 0); });
  const NodeAssignment second = c10d_rendezvous(group, 1, 0);
  EXPECT_EQ(second.nnodes, 2);
  EXPECT_EQ(first.get().world_size, 2);
}

// A restart's meeting does not wait the last call (600 s here) for a node of the meeting before
// whose agent is gone (nothing listens at its presence): it closes with the nodes that came and
// names the one it lost.
TEST(Rendezvous, ARestartClosesWithoutTheLastCallForANodeThatIsGone) {
  const int port = find_free_port();
  const NodeGroup group = c10d_group("2:3", port, "join_timeout=60,last_call_timeout=600");
  const NodeGroup two = c10d_group("2", port, "join_timeout=60");  // the first meeting: 2 nodes
  auto first = std::async(std::launch::async, [&two] { return c10d_rendezvous(two, 1, 0); });
  NodeAssignment last = c10d_rendezvous(two, 1, 0);
  first.get();
  ASSERT_EQ(last.members.size(), 2u);
  EXPECT_TRUE(last.lost.empty());
  NodeMember gone = last.members.front();
  gone.host = "gone";
  gone.presence_port = find_free_port();  // nobody listens there
  last.members.push_back(gone);
  auto other = std::async(std::launch::async,
                          [&group, &last] { return c10d_rendezvous(group, 1, 1, &last); });
  const NodeAssignment node = c10d_rendezvous(group, 1, 1, &last);
  EXPECT_EQ(other.get().nnodes, 2);
  EXPECT_EQ(node.nnodes, 2);
  EXPECT_EQ(node.world_size, 2);
  EXPECT_EQ(node.lost, (std::vector<std::string>{"node 2 (host gone, " + gone.address + ")"}));
}

TEST(Rendezvous, AnAgentAloneStopsAfterTheJoinTimeoutNamingTheEndpoint) {
  const int port = find_free_port();
  try {
    c10d_rendezvous(c10d_group("2", port, "join_timeout=1"), 1, 0);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port) + " has 1 of at least 2 nodes"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace pptrain
