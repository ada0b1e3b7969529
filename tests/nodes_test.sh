#!/usr/bin/env bash
# pptrain's node agents on two hosts, on this one machine: node1 and node2 are network
# namespaces of their own (own address, own host name, joined by a bridge: netns_cluster.sh), and
# each runs one agent. tests/cluster_test.sh runs the same command lines with both agents on
# 127.0.0.1; here the master and the rendezvous are on another host, as on a real cluster. Each
# of these gives the losses of the one-process run (1e-5 relative):
#   static:  `pptrain run --nnodes 2 --node-rank R --master-addr <node1's address> ... --pp 2`;
#            `pptrain train` as its own agent, the master named by host name (--master_addr node1);
#   c10d:    `pptrain run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d
#            --rdzv-endpoint=<node1's address>:29400 --rdzv-id=job1 ... --pp 2`, torchrun's line
#            as torch's docs write it; 2 ranks per node (--nproc-per-node 2, --pp 4); and the
#            endpoint by a name that node1's /etc/hosts gives as 127.0.1.1 (Debian's habit).
# Each agent says its place on one line: node 0 and node 1, the master on the address of node 0's
# host (never 127.0.0.1, which on another host is nobody). And bad input: an agent whose
# rendezvous endpoint nobody serves exits 1 once its join timeout is over, with one error line
# naming the endpoint, and leaves nothing running.
#
#   bash tests/nodes_test.sh PPTRAIN_BINARY
#
# Needs root, else it fails; it exits 77 (skipped) only when the kernel lacks a feature it needs
# (network, UTS or mount namespaces, veth, bridge). Every process and namespace it starts is gone
# when it ends, also when it is killed.
set -uo pipefail
binary=${1:-}
[ -n "$binary" ] && [ -x "$binary" ] ||
  { echo "usage: bash tests/nodes_test.sh PPTRAIN_BINARY (no executable '$binary')"; exit 2; }
binary=$(realpath "$binary")
[ "$(id -u)" = 0 ] || { echo "FAILED: needs root (network namespaces)"; exit 1; }
for c in ip unshare; do
  command -v "$c" >/dev/null || { echo "FAILED: no $c: run scripts/install-deps.sh"; exit 1; }
done
# The agents find their place in their flags alone: no launcher's variables of an outer run, and
# no GLOO_SOCKET_IFNAME naming an interface of the host.
unset "${!SLURM_@}" "${!OMPI_@}" "${!PMI_@}" MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK \
  GLOO_SOCKET_IFNAME

tests=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/process_groups.sh
source "$tests/process_groups.sh"
# shellcheck source=tests/netns_cluster.sh
source "$tests/netns_cluster.sh"
# Private namespaces: the addresses and ports clash with nothing on the host or beside this test.
# Above 127.0.0.1 on purpose: of two Gloo ranks the one at the greater address connects to the
# other, so a rank on node1 bound to the loopback (a master address fallen back to it) fails the
# run here, where under 10.x node1 would connect to node2 and hide it.
netns_cluster pptrain-nodes 192.168.215 node1 node2

model="--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
train="train $model --steps 3 --quiet"
reference_run one "$binary" $train --pp 1

# Runs `pptrain ARGS...` as agent NAME0 on node1 and NAME1 on node2, each with NODE_RANK in ARGS
# replaced by its index (0, 1), waits for both, and fails unless rank 0's metrics
# ($dir/NAME.jsonl) hold the one-process losses; `what` names the run.
on_both_hosts() {
  local name=$1 what=$2 r
  shift 2
  for r in 0 1; do
    start_host "$name$r" "${nodes[r]}" timeout 120 "$binary" "${@//NODE_RANK/$r}" \
      --metrics "$dir/$name.jsonl"
  done
  finish "${name}0"
  finish "${name}1"
  same_losses "$dir/$name.jsonl" "$what"
}
# Fails unless agents NAME0 (on node1) and NAME1 (on node2) said they are nodes 0 and 1 of 2,
# each with `nproc` ranks, and both named MASTER (default: the address of the host of node 0,
# which a c10d rendezvous picks) and PORT (any when empty) as the master. Then fails if any
# process is left in the hosts' namespaces.
check_places() {
  local name=$1 nproc=$2 port=$3 master=${4:-} r line place places="" ranks node0="" at
  local -a masters
  for r in 0 1; do
    line=$(grep "^pptrain: node [0-9]* of " "$dir/$name$r.err")
    [ "$(grep -c . <<<"$line")" = 1 ] || fail "$name$r: not one line saying its place: $line"
    place=${line#pptrain: node }
    place=${place%% *}
    places+=$place
    [ "$place" = 0 ] && node0=$r
    ranks="rank $place of 2"
    [ "$nproc" = 2 ] && ranks="ranks $((2 * place))-$((2 * place + 1)) of 4"
    [[ $line == "pptrain: node $place of 2 ($ranks), master "* ]] ||
      fail "$name$r: '$line' is not 'node $place of 2 ($ranks), master ...'"
    # "... master HOST:PORT" or "... master HOST:PORT, run ID"
    at=${line#*, master }
    masters+=("${at%%,*}")
  done
  [ "$places" = 01 ] || [ "$places" = 10 ] ||
    fail "$name: the agents are not nodes 0 and 1: $(cat "$dir/$name"[01].err | grep node)"
  master=${master:-${node_addr[node0]}}
  for at in "${masters[@]}"; do
    [ "${at%:*}" = "$master" ] ||
      fail "$name: an agent names the master ${at%:*}, not $master (node 0 is on ${nodes[node0]})"
    [ -z "$port" ] || [ "${at##*:}" = "$port" ] ||
      fail "$name: an agent names the master's port ${at##*:}, not $port"
  done
  [ "${masters[0]}" = "${masters[1]}" ] ||
    fail "$name: the agents name different masters: ${masters[*]}"
  echo "$name: node 0 on ${nodes[node0]}, both agents name the master ${masters[0]}"
  nothing_left "$name"
}

# 1. Static rendezvous: two `pptrain run` agents, the master on node1's address.
on_both_hosts static "pptrain run, static, 2 hosts" run --nnodes 2 --nproc-per-node 1 \
  --node-rank NODE_RANK --master-addr "${node_addr[0]}" --master-port 29500 "$binary" $train --pp 2
check_places static 1 29500

# `pptrain train` as its own node agent, torchrun's other spelling of the flags; the master by
# host name, which each host finds in its /etc/hosts.
on_both_hosts train "pptrain train, static, 2 hosts" $train --pp 2 --nnodes 2 \
  --node_rank NODE_RANK --master_addr node1 --master_port 29501
check_places train 1 29501 node1

# 2. c10d rendezvous, as torch's docs write torchrun's line, started once on each host: node1's
# agent serves the endpoint, and the node ranks go in order of arrival.
on_both_hosts c10d "pptrain run, c10d rendezvous, 2 hosts" run --nnodes=2 --nproc-per-node=1 \
  --rdzv-backend=c10d --rdzv-endpoint="${node_addr[0]}":29400 --rdzv-id=job1 "$binary" $train \
  --pp 2
check_places c10d 1 ""

# Two ranks on each host.
on_both_hosts c10d2x "pptrain run --nproc-per-node=2 --pp 4, c10d rendezvous, 2 hosts" run \
  --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint="${node_addr[0]}":29401 \
  --rdzv-id=job2 "$binary" $train --pp 4
check_places c10d2x 2 ""

# The endpoint by host name, which node1's own /etc/hosts gives as 127.0.1.1, as Debian's
# installer writes it: node1's agent reaches its store through the loopback, but the master it
# publishes must be its address on the network the hosts share.
{ echo "127.0.1.1 node1"; cat "$dir/hosts"; } >"$dir/hosts-node1"
on_both_hosts loopback "pptrain run, c10d rendezvous at node1 = 127.0.1.1 on node1" run \
  --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=node1:29402 --rdzv-id=job4 \
  "$binary" $train --pp 2
check_places loopback 1 ""
rm "$dir/hosts-node1"

# 3. Bad input: the endpoint an address of the hosts' network that nobody has. The agent gives up
# after its join timeout (5 s; 15 s at most, LibTorch's start on a loaded machine included) with
# one error line naming the endpoint (c10d's own warnings about each attempt come before it), and
# exit 1.
began=$SECONDS
start_host unserved node2 timeout 60 "$binary" run --nnodes=2 --rdzv-backend=c10d \
  --rdzv-endpoint=192.168.215.99:29400 --rdzv-id=job3 --rdzv-conf join_timeout=5 /bin/true
finish unserved 1
took=$((SECONDS - began))
[ "$took" -le 15 ] || fail "unserved: the agent took $took s to give up (join_timeout=5)"
error=$(grep "pptrain: error: " "$dir/unserved.err")
[ "$(grep -c . <<<"$error")" = 1 ] &&
  grep -q "rendezvous endpoint 192.168.215.99:29400 did not answer within 5 s" <<<"$error" ||
  fail "unserved: not one error line naming the endpoint: $(cat "$dir/unserved.err")"
nothing_left unserved
echo "unserved endpoint: exit 1 after $took s: $error"
echo "nodes: all passed in $SECONDS s"
