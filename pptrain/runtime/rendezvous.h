// Where a node agent's ranks stand in a run over several nodes: `pptrain run` and `pptrain
// train` given torchrun's --nnodes flags (cluster_env.h: NodeGroup) ask this before they start
// their local ranks (runtime/launcher.h: LaunchOptions::node).
//
//   NodeGroup group = resolve_node_group(flags);
//   NodeAssignment node = group.dynamic ? c10d_rendezvous(group, nproc, restart)
//                                       : static_assignment(group, nproc);
//
// Static (--node-rank, --master-addr, --master-port): every node is told its place; nothing is
// exchanged, and rank 0 of node 0 serves the ranks' store at the master address.
//
// Dynamic (--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID): the agents meet in a
// c10d TCPStore at the endpoint, which the first agent on the endpoint's host serves (the others
// connect to it). Each agent takes the next node rank in order of arrival; the first closes the
// rendezvous once MAX nodes came, or MIN and last_call_timeout has passed since, and publishes
// the master address: its own address towards the endpoint (towards another host's agent when
// that is a loopback address: the endpoint names its host) and a free port of its host. Every
// restart meets again in a round of its own: the highest any agent at the store asks for. The
// store exists only during the meeting, so an agent forks its ranks with no thread of LibTorch's
// running.
//
// A restart's meeting closes as soon as every node of the meeting before has come again or is
// gone: each agent listens on a port of its own while it lives (its presence, published in the
// store), and the agent that closes the meeting tries the presence of each node that has not
// come. A node whose presence refuses or does not answer is lost; the meeting names it
// (NodeAssignment::lost) and goes on without it, without waiting for the last call.
//
// An elastic run (MIN < MAX) that met with fewer than MAX nodes keeps a doorbell at the
// endpoint while it trains: the agent that served the meeting listens on the endpoint's port. A
// node that comes then rings it (c10d_rendezvous does at an agent's first meeting under MIN <
// MAX, before it looks for the store), the agent stops its ranks (node_asks_to_join()), the
// others' ranks fail with them, and all meet again, with the new node, in the next round. A
// node of an earlier meeting that the others went on without (its link was cut, its host
// frozen) finds the doorbell too when it comes back: its short try at the store fails, and it
// rings as a new node does.
#pragma once

#include <string>

#include "pptrain/runtime/cluster_env.h"

namespace pptrain {

// The node's place given on the command line (static rendezvous) for `nproc` ranks per node.
// master_port stays 0 on one node without --master-port: the launcher picks a free port.
NodeAssignment static_assignment(const NodeGroup& group, int nproc);

// Meets the other node agents of group.run_id at the endpoint in `round` (0, then the restart
// count; or a later round the others meet in: NodeAssignment::round) and returns this node's
// place; its `nproc` ranks, which may differ from node to node.
// Fails (std::runtime_error, one line naming the endpoint) when the endpoint does not answer
// within join_timeout, fewer than MIN nodes come in that time, or the rendezvous closed before
// this agent came.
// `last`: this agent's place in the meeting before (a restart), whose nodes the meeting waits
// for unless they are gone; null for the first.
NodeAssignment c10d_rendezvous(const NodeGroup& group, int nproc, int round,
                               const NodeAssignment* last = nullptr);

// True once a node rang this agent's doorbell (see above) to join the run: the agent then stops
// its ranks and meets the others again. False on an agent without a doorbell. For a launcher's
// poll loop: it waits for nothing but a ringing node's one-line request (at most a second).
bool node_asks_to_join();

// The local address this host reaches `host` from, which is where the others (ranks, node
// agents) reach this one; empty when no route is found. (In transport.cpp, whose Gloo device
// binds it.)
std::string local_address_towards(const std::string& host, int port);

// One line for the agent's stderr: "node 1 of 2 (ranks 2-3 of 4), master 10.0.0.1:29500".
std::string describe_node(const NodeAssignment& node, int nproc);

}  // namespace pptrain
