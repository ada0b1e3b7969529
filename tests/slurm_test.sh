#!/usr/bin/env bash
# pptrain under a real Slurm: a throw-away cluster of Debian's slurmctld, two slurmd and a munged
# of its own, on this one machine. Each slurmd lives in a network namespace of its own with its
# own address and host name (node1, node2), the controller and munged in a third (head) joined to
# both by veth pairs on a bridge. On it
#   srun -N 2 -n 4 pptrain train --pp 4 ...   and   sbatch examples/cluster/train.sbatch
# give the losses of the one-process run (1e-5 relative), and rank 0 says "launcher found: slurm".
# tests/cluster_test.sh sets srun's variables by hand; here srun itself places the tasks and
# sets SLURM_PROCID, SLURM_STEP_NODELIST and SLURM_JOB_ID (pptrain's port comes from the job id).
#
#   bash tests/slurm_test.sh PPTRAIN_BINARY
#
# Needs root and the packages of scripts/install-deps.sh, else it fails; it exits 77 (skipped)
# only when the kernel lacks a feature it needs (network, UTS or mount namespaces, veth, bridge).
# Every process, namespace and file of the cluster is gone when it ends, also when it is killed.
set -uo pipefail
binary=${1:-}
[ -n "$binary" ] && [ -x "$binary" ] ||
  { echo "usage: bash tests/slurm_test.sh PPTRAIN_BINARY (no executable '$binary')"; exit 2; }
binary=$(realpath "$binary")
# The daemons are in /usr/sbin, which a non-login shell's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

[ "$(id -u)" = 0 ] || { echo "FAILED: needs root (network namespaces, SlurmUser=root)"; exit 1; }
missing=""
for c in slurmctld slurmd srun sbatch sinfo scancel munged mungekey ip unshare; do
  command -v "$c" >/dev/null || missing+=" $c"
done
[ -z "$missing" ] || { echo "FAILED: no$missing: run scripts/install-deps.sh"; exit 1; }

# The cluster answers to nobody else: a run under an outer Slurm job or torchrun must not hand
# its variables to srun, which passes the environment on to the tasks.
unset "${!SLURM_@}" MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK

tests=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/process_groups.sh
source "$tests/process_groups.sh"
# munged wants every directory above its socket searchable by all; mktemp made $dir 0700.
chmod 755 "$dir"
cd "$dir" || exit 1
# shellcheck source=tests/netns_cluster.sh
source "$tests/netns_cluster.sh"

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.err "$dir"/*.log; do [ -s "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
  exit 1
}
# start_host of a daemon (netns_cluster.sh: on its host, under its host name, with the cluster's
# /etc/hosts: Slurm's daemons check their host name, and the tasks reach rank 0 by the node name
# SLURM_STEP_NODELIST gives). A daemon ends killed, which bash would report; it is no news.
start_daemon() {
  start_host "$@"
  disown "${pid[$1]}"
}

# 1. The network: the head (slurmctld, munged) and node1, node2 (a slurmd each). Private
# namespaces: these addresses and Slurm's ports (6817, 6818) clash with nothing on the host or in
# a test running beside this one, so they need not be picked at run time.
netns_cluster pptrain-slurm 10.214.0 node1 node2
# Jobs first, so that no slurmstepd starts a task while the cluster is torn down.
trap '[ -s "$dir/slurmctld.pid" ] && timeout 5 ip netns exec "$head_ns" scancel --full --quiet \
  --user root 2>/dev/null; stop_cluster; cleanup' EXIT

# 2. munge with its own key and socket: the system's munged, if any, is never asked.
mungekey --create --keyfile="$dir/munge.key" || fail "mungekey"
start_daemon munged head munged --foreground --socket="$dir/munge.socket" \
  --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
  --seed-file="$dir/munged.seed"

# 3. Slurm. Each node has 2 CPUs, so that `srun -N 2 -n 4` puts 2 tasks on each;
# config_overrides keeps slurmd from draining a node whose machine has fewer (both nodes share
# this one). slurmd 22.05 starts a cgroup plugin whatever the other plugins are, and `ip netns
# exec` hides /sys/fs/cgroup; cgroup/v1 under an empty folder of ours loads without touching any
# cgroup, as proctrack/linuxproc and task/none never ask it for one.
mkdir -p "$dir/state" "$dir/cgroup" "$dir/node1" "$dir/node2"
cat >"$dir/slurm.conf" <<EOF
ClusterName=pptrain
SlurmctldHost=head($head_addr)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=10
KillWait=2
NodeName=node1 NodeAddr=${node_addr[0]} CPUs=2 State=UNKNOWN
NodeName=node2 NodeAddr=${node_addr[1]} CPUs=2 State=UNKNOWN
PartitionName=test Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s/cgroup\nCgroupAutomount=no\n' "$dir" \
  >"$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf
start_daemon slurmctld head slurmctld -D -i
for i in 0 1; do
  start_daemon "slurmd_${nodes[i]}" "${nodes[i]}" slurmd -D -N "${nodes[i]}"
done
in_head() { ip netns exec "$head_ns" "$@"; }
for _ in $(seq 120); do
  [ "$(in_head sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 2 ] && break
  sleep 0.5
done
[ "$(in_head sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 2 ] ||
  fail "the nodes are not idle after 60 s: $(in_head sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')"
echo "slurm: node1 and node2 idle"

# The line of rank 0 (and of no other rank) naming Slurm, the first node and the job's port.
launcher_line() {
  local line="pptrain: launcher found: slurm: rank 0 of 4, master node1:[0-9]* (first host of"
  line+=" SLURM_STEP_NODELIST, port from SLURM_JOB_ID)"
  [ "$(grep -c "launcher found" "$1")" = 1 ] && grep -qx "$line" "$1" ||
    fail "$2: not one line '$line' in $1: $(grep "launcher" "$1")"
}

# 4. srun: 4 tasks on 2 nodes, 2 on each, one rank each.
start placement timeout 60 ip netns exec "$head_ns" srun -N 2 -n 4 hostname
finish placement
[ "$(sort "$dir/placement.out" | tr '\n' ' ')" = "node1 node1 node2 node2 " ] ||
  fail "srun -N 2 -n 4 hostname: $(tr '\n' ' ' <"$dir/placement.out")"
echo "srun -N 2 -n 4 hostname: node1 twice, node2 twice"
model="--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
train="train $model --steps 3 --quiet"
reference_run one "$binary" $train --pp 1
start srun timeout 120 ip netns exec "$head_ns" srun -N 2 -n 4 "$binary" $train --pp 4 \
  --metrics "$dir/srun.jsonl"
finish srun
same_losses "$dir/srun.jsonl" "srun -N 2 -n 4 pptrain train --pp 4"
launcher_line "$dir/srun.err" "srun"

# 5. sbatch of the example as written but for its 200 steps (minutes here): 3 steps, `pptrain`
# found on PATH, which sbatch hands to the job. Its model flags are checked to be the ones of
# the reference run below. --cpus-per-task=1 on the command line overrides the script's 4,
# more than these nodes have, as a user of a small cluster would.
example=$tests/../examples/cluster/train.sbatch
flags="--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --pp 4 --schedule 1f1b"
flags+=" --microbatches 8 --batch-size 8 --steps 200 --threads 4"
sed -n '/^srun pptrain train/,/[^\\]$/p' "$example" | tr -d '\\\n' | tr -s ' ' |
  grep -qF -- "srun pptrain train $flags " || fail "$example no longer runs '$flags'"
sed 's/--steps 200 /--steps 3 /' "$example" >"$dir/train.sbatch"
flags=${flags/--steps 200/--steps 3}
reference_run example_one "$binary" train ${flags/--pp 4/--pp 1} --quiet
start sbatch env PATH="$(dirname "$binary"):$PATH" timeout 60 ip netns exec "$head_ns" \
  sbatch --parsable --cpus-per-task=1 "$dir/train.sbatch"
finish sbatch
job=$(cut -d';' -f1 "$dir/sbatch.out")
[ -n "$job" ] || fail "sbatch named no job: $(cat "$dir/sbatch.out")"
# `sbatch --wait` would do, but it looks at the job at growing intervals of up to 10 s, so it may
# see the end late; this asks every half second, for 150 s at most.
for _ in $(seq 300); do
  state=$(in_head scontrol show job -o "$job" 2>&1 | grep -o 'JobState=[A-Z_]*')
  case $state in
    JobState=PENDING | JobState=CONFIGURING | JobState=RUNNING | JobState=COMPLETING) sleep 0.5 ;;
    *) break ;;
  esac
done
[ "$state" = JobState=COMPLETED ] || fail "sbatch: job $job is ${state:-unknown} (not COMPLETED)"
same_losses "$dir/metrics-$job.jsonl" "sbatch examples/cluster/train.sbatch (3 steps)"
launcher_line "$dir/pptrain-$job.out" "sbatch"
[ -d "$dir/ckpt-pptrain-gpt" ] || fail "sbatch: no checkpoint ckpt-pptrain-gpt"
echo "slurm: all passed in $SECONDS s"
