#!/usr/bin/env bash
# Time from a node lost to the next step on the nodes left (issue 48): three `pptrain train` node
# agents of one rank each on this host, --nnodes 2:3 with a c10d rendezvous, gpt 8 layers x
# d_model 256 on --pp 3 with a checkpoint every 5 steps. Once step KILL_AT is in the metrics,
# one node (not rank 0's) is killed whole; the bench prints the seconds from the kill to the
# first step the two left finish (the workers' failure, the rendezvous with its last call, the
# re-plan, the start of the new workers, the resume and that step), and that the losses after
# it are the one-process run's. Then a fourth node comes: the bench prints the seconds from its
# start to the first step the three finish (its ring at the endpoint, the two stopping their
# ranks, the meeting, the re-plan and the resume).
#
#   bench/elastic_bench.sh [path/to/pptrain]          # default: build/tools/pptrain/pptrain
#   LAST_CALL=5 KILL_AT=7 STEPS=24 bench/elastic_bench.sh
#
# LAST_CALL: --rdzv-conf last_call_timeout, how long the first agent of a round waits for more
# nodes once MIN came, unless every node it waits for came or is gone (torchrun's default, 30 s).
set -uo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
LAST_CALL=${LAST_CALL:-30}
KILL_AT=${KILL_AT:-7}
STEPS=${STEPS:-24}
[[ -x "$PPTRAIN" ]] || { echo "elastic_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
source tests/process_groups.sh  # dir, groups, free_port
model="--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 4"
train="train $model --schedule 1f1b --steps $STEPS --quiet"
now() { date +%s.%N; }
step_losses() { sed -n 's/.*"step":\([0-9]*\),.*"loss":\([0-9.eE+-]*\).*/\1 \2/p' "$1"; }

"$PPTRAIN" $train --pp 1 --metrics "$dir/one.jsonl" >/dev/null 2>&1 || { echo "the one-process run failed"; exit 1; }
port=$(free_port)
declare -A pid
for n in 0 1 2; do
  setsid "$PPTRAIN" $train --pp 3 --metrics "$dir/m.jsonl" --save "$dir/ckpt" --save-every 5 \
    --max-restarts 2 --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint 127.0.0.1:"$port" --rdzv-id bench \
    --rdzv-conf "join_timeout=120,last_call_timeout=$LAST_CALL" >/dev/null 2>"$dir/node$n.err" &
  pid[node$n]=$!
  groups+=("$!")
done
victim=""
until [ -n "$victim" ] && grep -q "\"step\":$KILL_AT," "$dir/m.jsonl" 2>/dev/null; do
  for n in 0 1 2; do grep -q "^pptrain: node 2 of 3" "$dir/node$n.err" 2>/dev/null && victim=node$n; done
  sleep 0.05
done
lost=$(now)
kill -KILL -- "-${pid[$victim]}"
# The re-planned run starts the metrics file again: its first line is the first step after the loss.
until [ -s "$dir/m.jsonl" ] && ! grep -q "\"step\":$KILL_AT," "$dir/m.jsonl"; do sleep 0.05; done
until [ "$(step_losses "$dir/m.jsonl" | wc -l)" -ge 1 ]; do sleep 0.05; done
next=$(now)
first=$(step_losses "$dir/m.jsonl" | head -n 1 | cut -d' ' -f1)
# A fourth node comes once the two train.
joined=$(now)
setsid "$PPTRAIN" $train --pp 3 --metrics "$dir/m.jsonl" --save "$dir/ckpt" --save-every 5 \
  --max-restarts 2 --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:"$port" --rdzv-id bench \
  --rdzv-conf "join_timeout=120,last_call_timeout=$LAST_CALL" >/dev/null 2>"$dir/node3.err" &
pid[node3]=$!
groups+=("$!")
until grep -q "goes on as --pp 3" "$dir/node3.err" 2>/dev/null; do sleep 0.05; done
# (A step of the three reports three ranks' figures.)
until grep -q '"weight_versions":\[1,1,1\]' "$dir/m.jsonl" 2>/dev/null; do sleep 0.05; done
three=$(now)
rejoined=$(step_losses "$dir/m.jsonl" | head -n 1 | cut -d' ' -f1)
for n in 0 1 2 3; do [ "node$n" = "$victim" ] || wait "${pid[node$n]}"; done
same=$(awk 'NR == FNR { want[$1] = $2; next }
  { d = $2 - want[$1]; if (d < 0) d = -d; s = want[$1] < 0 ? -want[$1] : want[$1]; if (d > 1e-5 * s) bad = 1 }
  END { print bad ? "DIFFERENT" : "the same" }' <(step_losses "$dir/one.jsonl") <(step_losses "$dir/m.jsonl"))
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
echo "killed $victim after step $KILL_AT of $STEPS (a checkpoint every 5 steps, last call ${LAST_CALL} s)"
echo "the 2 nodes left finished step $first $(awk -v a="$lost" -v b="$next" 'BEGIN {printf "%.1f", b - a}') s after the loss"
echo "$(grep -h "goes on as" "$dir"/node*.err | head -n 1)"
echo "a node came: the 3 nodes finished step $rejoined $(awk -v a="$joined" -v b="$three" 'BEGIN {printf "%.1f", b - a}') s after its start"
echo "$(grep -h "goes on as --pp 3" "$dir"/node3.err | head -n 1)"
echo "losses of steps $rejoined-$STEPS (the last layout) against one process: $same"
