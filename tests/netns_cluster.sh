# shellcheck shell=bash disable=SC2154  # $dir, start and fail are process_groups.sh's
# Sourced after process_groups.sh by the tests that need several hosts on this one machine
# (slurm_test.sh, nodes_test.sh): a throw-away cluster of network namespaces. A head namespace
# holds a bridge; each node is a namespace of its own with its own address, joined to the bridge
# by a veth pair, and start_host runs a command on a host in UTS and mount namespaces of its own
# too, where `hostname` is the host's name and /etc/hosts names every host of the cluster.
#
#   source "$tests/netns_cluster.sh"
#   netns_cluster pptrain-nodes 192.168.215 node1 node2   # head .1, node1 .2, node2 .3
#   start_host agent1 node1 pptrain run ...            # as process_groups.sh's start
#   nothing_left "what ran"                             # fails if a process is left on a node
#
# Needs root (the test checks it first, and fails without it); exits 77 (skipped) only when the
# kernel lacks a feature: network, UTS or mount namespaces, veth pairs, bridges. Every process in
# the namespaces is killed and the namespaces deleted when the test ends (trap on EXIT: a test
# that sets its own calls stop_cluster in it, before cleanup), also when CTest kills it.

skip() { echo "skipped: $*"; exit 77; }

# Kills everything in the cluster's namespaces (what a host's processes start need be in no
# process group the script knows), then deletes the namespaces, which takes the veths and the
# bridge along.
teardown() {
  local ns pids killed="" _
  for _ in 1 2 3 4 5; do
    pids=""
    for ns in "${namespaces[@]}"; do pids+=" $(ip netns pids "$ns" 2>/dev/null)"; done
    [ -z "${pids// /}" ] && break
    kill -KILL $pids 2>/dev/null
    killed+=" $pids"
    sleep 0.2
  done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
  # Daemons' children are init's once the daemons die; wait (5 s at most) until init has reaped
  # them, so that no zombie outlives the test.
  for _ in $(seq 50); do
    kill -0 $killed 2>/dev/null || break
    sleep 0.1
  done
}

stop_cluster() {
  teardown
  kill -- "-$guard" 2>/dev/null
}

# netns_cluster TAG NET HOST...: the head namespace TAG-$$-head at NET.1 (host name `head`) and
# one namespace TAG-$$-HOST per HOST, at NET.2, NET.3, ... Sets head_ns, namespaces (head first),
# host_ns[HOST], head_addr and node_addr (the HOSTs' addresses in order), and $dir/hosts.
declare -A host_ns
netns_cluster() {
  local tag=$1-$$ net=$2 i=0 host ns
  shift 2
  nodes=("$@")
  head_ns=$tag-head
  head_addr=$net.1
  host_ns=([head]=$head_ns)
  namespaces=("$head_ns")
  node_addr=()
  for host in "${nodes[@]}"; do
    host_ns[$host]=$tag-$host
    namespaces+=("$tag-$host")
    node_addr+=("$net.$((i + 2))")
    i=$((i + 1))
  done
  # CTest before 3.27 ends a test past its TIMEOUT with SIGKILL to the script and all below it,
  # so no trap runs. This guard, a child of init by the time that happens, tears the cluster down
  # and removes $dir once the script is gone.
  guard=$( (setsid bash -c "$(declare -p namespaces dir); $(declare -f teardown)
    while kill -0 $$ 2>/dev/null; do sleep 1; done; teardown; rm -rf \"\$dir\"" \
    </dev/null >/dev/null 2>&1 & echo $!) )
  trap 'stop_cluster; cleanup' EXIT

  ip netns add "$head_ns" 2>"$dir/netns.err" ||
    skip "no network namespaces: $(cat "$dir/netns.err")"
  ip netns exec "$head_ns" unshare --uts --mount true 2>"$dir/unshare.err" ||
    skip "no UTS or mount namespaces: $(cat "$dir/unshare.err")"
  ip -n "$head_ns" link add br0 type bridge 2>"$dir/bridge.err" ||
    skip "no bridge devices: $(cat "$dir/bridge.err")"
  ip -n "$head_ns" addr add "$head_addr/24" dev br0 && ip -n "$head_ns" link set br0 up &&
    ip -n "$head_ns" link set lo up || fail "bridge address"
  printf '127.0.0.1 localhost\n%s head\n' "$head_addr" >"$dir/hosts"
  for i in "${!nodes[@]}"; do
    host=${nodes[i]}
    ns=${host_ns[$host]}
    ip netns add "$ns" || fail "namespace $ns"
    ip link add "$host" netns "$head_ns" type veth peer name eth0 netns "$ns" \
      2>"$dir/veth.err" || skip "no veth pairs: $(cat "$dir/veth.err")"
    ip -n "$head_ns" link set "$host" master br0 up &&
      ip -n "$ns" addr add "${node_addr[i]}/24" dev eth0 && ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || fail "link to $host"
    printf '%s %s\n' "${node_addr[i]}" "$host" >>"$dir/hosts"
  done
}

# start_host NAME HOST COMMAND...: process_groups.sh's start of COMMAND on HOST (`head` or a node),
# in its network namespace and in UTS and mount namespaces of its own where `hostname` is HOST
# and /etc/hosts is the cluster's ($dir/hosts, or HOST's own $dir/hosts-HOST when there is one).
# The command keeps the pid ${pid[NAME]}: finish waits for it.
start_host() {
  local name=$1 host=$2 hosts=$dir/hosts
  shift 2
  [ -f "$dir/hosts-$host" ] && hosts=$dir/hosts-$host
  start "$name" ip netns exec "${host_ns[$host]}" unshare --uts --mount sh -c \
    'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
    sh "$host" "$hosts" "$@"
}

# Fails if any process is left in the nodes' namespaces (the head's is not looked at) once what
# ran there ($1 names it) has ended; its ranks get 3 s to go.
nothing_left() {
  local left="" host _
  for _ in $(seq 30); do
    left=""
    for host in "${nodes[@]}"; do left+=" $(ip netns pids "${host_ns[$host]}")"; done
    [ -z "${left// /}" ] && return
    sleep 0.1
  done
  fail "$1: processes left running: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
}
