#!/usr/bin/env bash
# pptrain under the real torchrun (torch.distributed.run of the torch pptrain builds against):
# every torchrun command line of docs/CLUSTERS.md, against the same training without it (1e-5
# relative):
#   a) `torchrun --nproc-per-node 2 --no-python pptrain train --pp 2`: the losses of --pp 1;
#   b) `torchrun --nproc-per-node 2 examples/python/01_two_stage_mlp.py`: the losses it prints
#      under `pptrain run --nproc 2`;
#   c) static: two agents, --nnodes 2 --node-rank 0/1 --master-addr <node1's address>, each on a
#      host of its own (network namespaces, tests/netns_cluster.sh): the losses of --pp 1;
#   d) c10d: two agents, --rdzv-backend c10d --rdzv-endpoint <node1's address>:PORT --rdzv-id,
#      on the two hosts: the losses of --pp 1;
#   e) elastic: --nnodes 1:2 --max-restarts 1 (c10d), one rank of `pptrain train --pp 2 --save
#      DIR --save-every 5 --resume auto` on each host; node2 (its agent and its rank) is killed
#      mid-run; node1's agent restarts its rank alone (TORCHELASTIC_RESTART_COUNT 1, WORLD_SIZE
#      1), which goes on as --pp 1 from the newest whole checkpoint, and the run ends with the
#      losses and the parameters (tests/same_weights.py) of the uninterrupted --pp 1 run;
#   f) restart in the same world: `torchrun --nproc-per-node 2 --max-restarts 1` of `pptrain
#      train --pp 2 --save DIR --save-every 5` (no --resume) through a wrapper in which rank 1 of
#      attempt 0 kills itself at step 20; torchrun starts both ranks again (restart_count=1) in
#      its same store, and they end with e)'s uninterrupted losses and parameters.
# Each torchrun runs in a network namespace: torchrun starts its workers in sessions of their
# own, out of reach of a kill of its process group, and everything in the namespaces is killed
# when the test ends; after each case nothing may be left running there.
#
#   bash tests/torchrun_test.sh PPTRAIN_BINARY [PYTHONPATH_OF_THE_PACKAGE]
#
# PPTRAIN_PYTHON is the interpreter with torch (default: the repository's .venv/bin/python); the
# package defaults to the build's python/ folder beside tools/pptrain/pptrain, and b) is skipped,
# in one line, when it has no _runtime module (a build without the Python bindings). Needs root
# (network namespaces), else it fails; it exits 77 (skipped) only when the kernel lacks a feature
# it needs. About a minute on 2 cores.
set -uo pipefail
binary=${1:-}
[ -n "$binary" ] && [ -x "$binary" ] ||
  { echo "usage: bash tests/torchrun_test.sh PPTRAIN_BINARY (no executable '$binary')"; exit 2; }
binary=$(realpath "$binary")
tests=$(cd "$(dirname "$0")" && pwd)
python=${PPTRAIN_PYTHON:-$tests/../.venv/bin/python}
python_path=${2:-$(dirname "$binary")/../../python}
[ "$(id -u)" = 0 ] || { echo "FAILED: needs root (network namespaces)"; exit 1; }
for c in ip unshare; do
  command -v "$c" >/dev/null || { echo "FAILED: no $c: run scripts/install-deps.sh"; exit 1; }
done
"$python" -c 'import torch.distributed.run' 2>/dev/null ||
  { echo "FAILED: no torchrun in '$python' (scripts/setup-venv.sh, or PPTRAIN_PYTHON)"; exit 1; }
python_path=$(realpath -m "$python_path")
# The ranks find their place in torchrun's variables alone: none of an outer run.
unset "${!SLURM_@}" "${!OMPI_@}" "${!PMI_@}" "${!TORCHELASTIC_@}" MASTER_ADDR MASTER_PORT RANK \
  WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GLOO_SOCKET_IFNAME

# shellcheck source=tests/process_groups.sh
source "$tests/process_groups.sh"
# shellcheck source=tests/netns_cluster.sh
source "$tests/netns_cluster.sh"
# Another net than nodes_test.sh's and slurm_test.sh's, above 127.0.0.1 for the same reason
# (nodes_test.sh: a rank of node1 bound to the loopback fails the run).
netns_cluster pptrain-torchrun 192.168.216 node1 node2

# torchrun_on NAME HOST ARGS...: torchrun's agent NAME on HOST (a node), 120 s at most, its log
# at INFO (the rendezvous' results, the restarts) and its log folder in $dir (TMPDIR).
torchrun_on() {
  local name=$1 host=$2
  shift 2
  start_host "$name" "$host" env LOGLEVEL=INFO TMPDIR="$dir" timeout 120 "$python" \
    -m torch.distributed.run "$@"
}
# The first error lines of agent NAME and its ranks (torchrun's own summary, at the end, names
# no cause).
errors_of() {
  grep -v '^frame\|^[IW][0-9]' "$dir/$1.err" | grep -i -m 8 'error\|exception\|signal\|exitcode'
}
# Waits for agent NAME; fails unless it exits 0.
finish_agent() {
  local name=$1 status=0
  wait "${pid[$name]}" || status=$?
  [ "$status" = 0 ] || fail "$name: torchrun exited $status: $(errors_of "$name")"
}
# Seconds since the case began (`began=$SECONDS` first).
took() { echo "$((SECONDS - began)) s"; }

model="--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
train="train $model --steps 3 --quiet"
reference_run one "$binary" $train --pp 1

# a) Two ranks of `pptrain train --pp 2` on one node.
began=$SECONDS
torchrun_on a node1 --nproc-per-node 2 --master-port 29500 --no-python "$binary" $train --pp 2 \
  --metrics "$dir/a.jsonl"
finish_agent a
same_losses "$dir/a.jsonl" "a) torchrun --nproc-per-node 2 pptrain train --pp 2 ($(took))"
nothing_left a

# b) A Python program of the package: the losses it prints under `pptrain run --nproc 2`.
# Skipped (one line) in a build without the Python bindings.
if ! compgen -G "$python_path/pptrain/_runtime*.so" >/dev/null; then
  echo "b) skipped: no pptrain package with its _runtime module in $python_path"
else
  began=$SECONDS
  example=$tests/../examples/python/01_two_stage_mlp.py
  start b_run env PYTHONPATH="$python_path" timeout 120 "$binary" run --nproc 2 "$python" "$example"
  finish b_run
  PYTHONPATH=$python_path torchrun_on b node1 --nproc-per-node 2 --master-port 29501 "$example"
  finish_agent b
  [ "$(grep -c '^step [0-9]* loss ' "$dir/b_run.out")" = 5 ] ||
    fail "b) pptrain run printed no 5 losses: $(cat "$dir/b_run.out")"
  # "step 0 loss 1.13791314": the same steps, the losses to 1e-5 relative.
  awk 'NR == FNR { if ($1 == "step") want[$2] = $4; next }
       $1 == "step" { n++; d = $4 - want[$2]; if (d < 0) d = -d
         s = want[$2] < 0 ? -want[$2] : want[$2]
         if (!($2 in want) || d > 1e-5 * s + 1e-12) bad = 1 }
       END { exit bad || n != 5 }' "$dir/b_run.out" "$dir/b.out" ||
    fail "b) the losses under torchrun differ from pptrain run's:" \
      "$(cat "$dir/b.out") against $(cat "$dir/b_run.out")"
  echo "b) torchrun --nproc-per-node 2 01_two_stage_mlp.py: the losses of pptrain run --nproc 2" \
    "($(took))"
  nothing_left b
fi

# on_both_hosts NAME WHAT ARGS...: torchrun's agent NAME0 on node1 and NAME1 on node2 with ARGS
# (NODE_RANK replaced by 0 and 1), each running one rank of `pptrain train --pp 2`; fails unless
# both end with 0 and rank 0's metrics hold the one-process losses.
on_both_hosts() {
  local name=$1 what=$2 r
  shift 2
  began=$SECONDS
  for r in 0 1; do
    torchrun_on "$name$r" "${nodes[r]}" "${@//NODE_RANK/$r}" --nproc-per-node 1 --no-python \
      "$binary" $train --pp 2 --metrics "$dir/$name.jsonl"
  done
  finish_agent "${name}0"
  finish_agent "${name}1"
  same_losses "$dir/$name.jsonl" "$what ($(took))"
  nothing_left "$name"
}

# c) The static rendezvous: node ranks and the master given.
on_both_hosts c "c) torchrun --nnodes 2 --node-rank 0/1 --master-addr ${node_addr[0]}, 2 hosts" \
  --nnodes 2 --node-rank NODE_RANK --master-addr "${node_addr[0]}" --master-port 29502

# d) The c10d rendezvous, node1's agent serving the endpoint; the node ranks from the store.
on_both_hosts d "d) torchrun --nnodes 2 --rdzv-backend c10d, 2 hosts" --nnodes 2 \
  --rdzv-backend c10d --rdzv-endpoint "${node_addr[0]}:29503" --rdzv-id job-d
grep -q "group_world_size=2" "$dir/d0.err" && grep -q "group_world_size=2" "$dir/d1.err" ||
  fail "d) the agents did not meet as 2 nodes: $(grep -h group_ "$dir"/d[01].err)"

# e) Elastic: a node lost mid-run, the run ends on the other as --pp 1.
began=$SECONDS
steps=200
elastic="train $model --schedule 1f1b --steps $steps --quiet"
start e_one timeout 120 "$binary" $elastic --pp 1 --metrics "$dir/e_one.jsonl" --save "$dir/e_one"
finish e_one
# The lost node is dropped from the meeting once its heartbeats (1 s) are 5 s late; a meeting of
# 1 node (the minimum) then waits 10 s more for a second (the last call: long enough for two
# agents started together to meet as 2 on a loaded machine, rather than 1 and then 2).
rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=5,last_call_timeout=10,join_timeout=60
for r in 0 1; do
  torchrun_on "e$r" "${nodes[r]}" --nnodes 1:2 --nproc-per-node 1 --max-restarts 1 \
    --rdzv-backend c10d --rdzv-endpoint "${node_addr[0]}:29504" --rdzv-id job-e \
    --rdzv-conf "$rdzv_conf" --no-python "$binary" $elastic --pp 2 \
    --metrics "$dir/e.jsonl" --save "$dir/e_ckpt" --save-every 5 --resume auto
done
# same_step_losses REFERENCE RUN: fails, the steps that differ on stdout, unless each step of
# metrics file RUN has REFERENCE's loss of that step (1e-5 relative) and RUN ends at step $steps.
same_step_losses() {
  awk 'NR == FNR { want[$1] = $2; next }
       { n++; last = $1; d = $2 - want[$1]; if (d < 0) d = -d
         s = want[$1] < 0 ? -want[$1] : want[$1]
         if (!($1 in want) || d > 1e-5 * s + 1e-12) {
           print "step " $1 ": " $2 " against " want[$1]; bad = 1 } }
       END { if (bad || n == 0 || last != steps) {
               print "steps trained: " n ", the last " last; exit 1 } }' \
    steps="$steps" <(step_losses "$1") <(step_losses "$2")
}

# Case CASE's restarted run (metrics $dir/CASE.jsonl, appended by each start, checkpoint
# $dir/CASE_ckpt) began after a checkpoint (after step 1, and by step LOST + 1 when LOST is given)
# and ended as the uninterrupted --pp 1 run (e_one): every step's loss, of every start, and the
# parameters. Sets `first`, the last start's first step.
expect_uninterrupted_end() {
  local case=$1 lost=${2:-} restart
  read -r restart _ _ _ first _ <<<"$(metrics_starts "$dir/$case.jsonl" | tail -n 1)"
  [ "${restart:-0}" -gt 0 ] || fail "$case) no step of a restart in the metrics"
  [ -n "$first" ] && [ "$first" -gt 1 ] && { [ -z "$lost" ] || [ "$first" -le $((lost + 1)) ]; } ||
    fail "$case) the restarted run began at step ${first:-none}, not after a checkpoint" \
      "${lost:+(lost at step $lost)}"
  same_step_losses "$dir/e_one.jsonl" "$dir/$case.jsonl" >"$dir/${case}_compare.txt" ||
    fail "$case) the run is not the uninterrupted --pp 1 run: $(cat "$dir/${case}_compare.txt")"
  "$python" "$tests/same_weights.py" "$dir/e_one" "$dir/${case}_ckpt" \
    >"$dir/${case}_weights.txt" 2>&1 ||
    fail "$case) the parameters differ from the --pp 1 run's: $(cat "$dir/${case}_weights.txt")"
}
# Nothing may fail before the loss: a restart then would be no test of losing a node.
for _ in $(seq 600); do
  grep -q '"step":20,' "$dir/e.jsonl" 2>/dev/null && break
  grep -q "failed (exitcode" "$dir"/e[01].err && break
  sleep 0.1
done
failed=$(grep -h "failed (exitcode" "$dir"/e[01].err | sed 's/.*\] //')
[ -z "$failed" ] || fail "e) a rank failed before node2 was lost: $failed"
grep -q '"step":20,' "$dir/e.jsonl" || fail "e) the 2-node run did not reach step 20"
grep -q "group_world_size=2" "$dir/e0.err" ||
  fail "e) the agents did not meet as 2 nodes: $(grep -h group_ "$dir"/e[01].err)"
# node2 as a whole: its agent and its rank (in a session of its own); disowned, so that bash
# does not report the kill.
disown "${pid[e1]}"
kill -KILL $(ip netns pids "${host_ns[node2]}") 2>/dev/null
lost_at=$(step_losses "$dir/e.jsonl" | tail -n 1 | cut -d' ' -f1)
status=0
wait "${pid[e0]}" || status=$?
if [ "$status" != 0 ]; then
  grep -q "WORLD_SIZE=1 does not match --pp 2" "$dir/e0.err" &&
    fail "e) the rank restarted alone did not re-plan for WORLD_SIZE=1:" \
      "$(grep -h '^pptrain: error' "$dir/e0.err")"
  fail "e) node1's agent exited $status after node2 was lost: $(errors_of e0)"
fi
grep -q "Worker group FAILED. 1/1 attempts left; will restart worker group" "$dir/e0.err" ||
  fail "e) node1's agent did not restart its rank after node2 was lost"
[ "$(grep -o "group_world_size=[0-9]*" "$dir/e0.err" | tail -n 1)" = group_world_size=1 ] &&
  [ "$(grep -o "restart_count=[0-9]*" "$dir/e0.err" | tail -n 1)" = restart_count=1 ] ||
  fail "e) node1's agent did not meet again alone:" \
    "$(grep -h "group_world_size\|restart_count" "$dir/e0.err")"
grep -q "^pptrain: .*the run goes on as --pp 1 --dp 1" "$dir/e0.err" ||
  fail "e) the rank restarted alone did not say it goes on as --pp 1"
# The restarted rank wrote the metrics from the checkpoint it continued on to the last step.
expect_uninterrupted_end e
echo "e) torchrun --nnodes 1:2 --max-restarts 1, node2 lost at step $lost_at: node1 went on" \
  "from step $((first - 1)) and ended with the --pp 1 run's losses and parameters" \
  "($(cat "$dir/e_weights.txt"); $(took))"
nothing_left e

# f) A rank lost on one node: torchrun starts the group again in a world of the same size, whose
# ranks meet in the agent's store of the attempt before (under keys of their own attempt) and go
# on from the newest whole checkpoint (a restarted rank with --save and no --resume resumes as
# with --resume auto). Rank 1 of attempt 0 kills itself (SIGKILL) once rank 0's metrics reach
# step 20, writing the step rank 0 had reached to $dir/f_lost_at.
began=$SECONDS
cat >"$dir/f_rank.sh" <<EOF
#!/bin/sh
if [ "\$RANK" = 1 ] && [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  (for _ in \$(seq 600); do
     if grep -q '"step":20,' "$dir/f.jsonl" 2>/dev/null; then
       sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$dir/f.jsonl" | tail -n 1 >"$dir/f_lost_at"
       kill -KILL \$\$
       exit
     fi
     sleep 0.1
   done) &
fi
exec "$binary" $elastic --pp 2 --metrics "$dir/f.jsonl" --save "$dir/f_ckpt" --save-every 5
EOF
chmod +x "$dir/f_rank.sh"
torchrun_on f node1 --nproc-per-node 2 --max-restarts 1 --master-port 29505 --no-python \
  "$dir/f_rank.sh"
finish_agent f
[ -s "$dir/f_lost_at" ] || fail "f) rank 0 of the first attempt did not reach step 20 in 60 s"
lost_at=$(cat "$dir/f_lost_at")
grep -q "failed (exitcode: -9) local_rank: 1" "$dir/f.err" &&
  grep -q "Worker group FAILED. 1/1 attempts left; will restart worker group" "$dir/f.err" &&
  [ "$(grep -o "restart_count=[0-9]*" "$dir/f.err" | tail -n 1)" = restart_count=1 ] ||
  fail "f) torchrun did not restart the group once after rank 1 was killed:" \
    "$(grep -h "exitcode\|attempts left\|restart_count" "$dir/f.err")"
expect_uninterrupted_end f "$lost_at"
echo "f) torchrun --nproc-per-node 2 --max-restarts 1, rank 1 killed at step $lost_at: the group" \
  "restarted went on from step $((first - 1)) and ended with the uninterrupted run's losses and" \
  "parameters ($(cat "$dir/f_weights.txt"); $(took))"
nothing_left f
echo "torchrun: all passed in $SECONDS s"
