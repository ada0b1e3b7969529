#!/usr/bin/env bash
# pptrain across nodes, on this one machine: every way of starting the ranks of a 2-rank
# training gives the losses of the one-process run (1e-5 relative):
#   static:  two `pptrain run` node agents, --nnodes 2 --node-rank 0/1 --master-addr 127.0.0.1;
#            and two `pptrain train` agents with the same flags;
#   c10d:    two `pptrain run` agents in a c10d rendezvous, torchrun's command line as torch's
#            docs write it (--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d ...);
#   Slurm:   two `pptrain train` processes with srun's variables (SLURM_PROCID, ...), the
#            master from the first host of SLURM_JOB_NODELIST; and Python's pptrain.world();
#   mpirun:  OpenMPI's `mpirun -np 2 pptrain train` (openmpi-bin, scripts/install-deps.sh).
# And bad input: one line, exit 2 (1 for an unreachable rendezvous), nothing left running.
#
#   bash tests/cluster_test.sh PPTRAIN_BINARY [PYTHONPATH_OF_THE_PACKAGE]
#
# Every process it starts is in a process group of its own, killed when the test ends.
set -uo pipefail
binary=$1
python_path=${2:-}
source "$(dirname "$0")/process_groups.sh"

model="--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
train="train $model --steps 3 --quiet"

reference_run one "$binary" $train --pp 1

# 1. Static rendezvous: two `pptrain run` agents of one rank each.
port=$(free_port)
for r in 0 1; do
  metrics=""
  [ $r = 0 ] && metrics="--metrics $dir/static.jsonl"
  start "static$r" timeout 120 "$binary" run --nnodes 2 --nproc-per-node 1 --node-rank $r \
    --master-addr 127.0.0.1 --master-port "$port" "$binary" $train --pp 2 $metrics
done
finish static0
finish static1
same_losses "$dir/static.jsonl" "pptrain run, static, 2 nodes"
grep -q "pptrain: node 1 of 2 (rank 1 of 2), master 127.0.0.1:$port" "$dir/static1.err" ||
  fail "agent 1 did not say its place"

# The same with `pptrain train` as the node agent, torchrun's other spelling of the flags.
port=$(free_port)
for r in 0 1; do
  start "train$r" timeout 120 "$binary" $train --pp 2 --metrics "$dir/train.jsonl" --nnodes 2 \
    --node_rank $r --master_addr 127.0.0.1 --master_port "$port"
done
finish train0
finish train1
same_losses "$dir/train.jsonl" "pptrain train, static, 2 nodes"

# 2. c10d rendezvous, as torch's docs write torchrun's line; the node ranks come from the store.
port=$(free_port)
for r in 0 1; do
  start "c10d$r" timeout 120 "$binary" run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:"$port" --rdzv-id=job1 "$binary" $train --pp 2 \
    --metrics "$dir/c10d.jsonl"
done
finish c10d0
finish c10d1
same_losses "$dir/c10d.jsonl" "pptrain run, c10d rendezvous, 2 nodes"
cat "$dir/c10d0.err" "$dir/c10d1.err" | grep -o "node [01] of 2 (rank [01] of 2), master [0-9.:]*, run job1" |
  sort | cut -c1-6 | tr '\n' ' ' | grep -qx "node 0 node 1 " || fail "the agents did not get nodes 0 and 1"

# The same with `pptrain train` agents, two ranks on each node.
port=$(free_port)
for r in 0 1; do
  start "c10dtrain$r" timeout 120 "$binary" $train --pp 4 --metrics "$dir/c10dtrain.jsonl" \
    --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:"$port" --rdzv-id job2
done
finish c10dtrain0
finish c10dtrain1
same_losses "$dir/c10dtrain.jsonl" "pptrain train --pp 4, c10d rendezvous, 2 nodes x 2"

# 3. Slurm without a wrapper: srun's variables, the master the first host of the node list.
port=$(free_port)
slurm_env() {
  echo SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=$1 SLURM_LOCALID=$1 \
    "SLURM_JOB_NODELIST=127.0.0.[1-2]" MASTER_PORT="$port"
}
for r in 0 1; do
  start "slurm$r" env $(slurm_env $r) timeout 120 "$binary" $train --pp 2 \
    --metrics "$dir/slurm.jsonl"
done
finish slurm0
finish slurm1
same_losses "$dir/slurm.jsonl" "srun's variables"
grep -qx "pptrain: launcher found: slurm: rank 0 of 2, master 127.0.0.1:$port (first host of SLURM_JOB_NODELIST, port from MASTER_PORT)" \
  "$dir/slurm0.err" || fail "rank 0 did not name the launcher"
grep -q "launcher found" "$dir/slurm1.err" && fail "rank 1 named the launcher too"

# Python's pptrain.world() (the C++ init_from_env()) under srun's variables.
if [ -n "$python_path" ]; then
  port=$(free_port)
  for r in 0 1; do
    start "python$r" env $(slurm_env $r) PYTHONPATH="$python_path" timeout 120 "${PPTRAIN_PYTHON:-python3}" \
      -c 'import pptrain; print("world", *pptrain.world())'
  done
  finish python0
  finish python1
  grep -qx "world 0 2" "$dir/python0.out" && grep -qx "world 1 2" "$dir/python1.out" ||
    fail "pptrain.world() under srun's variables: $(cat "$dir"/python*.out)"
  echo "srun's variables: pptrain.world() is (0, 2) and (1, 2)"
fi

# 4. OpenMPI's mpirun.
command -v mpirun >/dev/null || fail "no mpirun: install openmpi-bin (scripts/install-deps.sh)"
port=$(free_port)
start mpirun timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT="$port" \
  "$binary" $train --pp 2 --metrics "$dir/mpirun.jsonl"
finish mpirun
same_losses "$dir/mpirun.jsonl" "mpirun -np 2"
grep -q "pptrain: launcher found: openmpi: rank 0 of 2, master 127.0.0.1:$port" "$dir/mpirun.err" ||
  fail "mpirun: no line naming the launcher"

# 5. Bad input: one line, the exit status, no hang (timeout 60), nothing left running.
expect_error() {
  local name=$1 status=$2 words=$3
  shift 3
  start "$name" "$@"
  finish "$name" "$status"
  [ "$(grep -c "pptrain: error: " "$dir/$name.err")" = 1 ] ||
    fail "$name: not one error line: $(cat "$dir/$name.err")"
  grep -q -- "$words" "$dir/$name.err" || fail "$name: no '$words' in: $(cat "$dir/$name.err")"
  pgrep -g "${pid[$name]}" >/dev/null && fail "$name left processes running"
  echo "$name: $(grep "pptrain: error: " "$dir/$name.err")"
}
expect_error bad_nodelist 2 "SLURM_JOB_NODELIST: host list 'node\[01-'" \
  env SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=0 "SLURM_JOB_NODELIST=node[01-" \
  timeout 60 "$binary" $train --pp 2
expect_error node_rank 2 "--node-rank 2 is not below --nnodes 2" \
  timeout 60 "$binary" run --nnodes 2 --node-rank 2 /bin/true
expect_error min_max 2 "MIN 3 is above MAX 2" \
  timeout 60 "$binary" run --nnodes 3:2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:1 /bin/true
expect_error no_endpoint 2 "needs --rdzv-endpoint" \
  timeout 60 "$binary" $train --pp 2 --nnodes 2 --rdzv-backend c10d
expect_error unreachable 1 "rendezvous endpoint 192.0.2.1:29400 did not answer within 3 s" \
  timeout 60 "$binary" run --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 192.0.2.1 \
  --rdzv-conf join_timeout=3 /bin/true
port=$(free_port)
expect_error alone 1 "has 1 of at least 2 nodes after 3 s" \
  timeout 60 "$binary" run --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:"$port" \
  --rdzv-conf join_timeout=3 /bin/true
# Two nodes started with different training flags: each rank names the flag, exit 2.
port=$(free_port)
start differ0 timeout 60 "$binary" $train --pp 2 --nnodes 2 --node-rank 0 --master-port "$port"
start differ1 timeout 60 "$binary" $train --pp 2 --nnodes 2 --node-rank 1 --master-port "$port" \
  --seed 5
finish differ0 2
finish differ1 2
grep -q "seed" "$dir/differ0.err" || fail "different flags: rank 0 did not name --seed"
echo "different flags on two nodes: exit 2 on both, naming --seed"
echo "cluster: all passed"
