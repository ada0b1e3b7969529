#!/usr/bin/env bash
# A slow worker:
#   1. two ranks of `pptrain train --partition workers`, rank 1 held to a third of a core by a
#      cgroup from its start: rank 0 must measure rank 1 as the slower one, say so (one line per
#      rank), give it fewer layers, and the run must print the losses of `--pp 1`;
#   2. two ranks of `--replan auto` on the uniform cut, rank 1 put into the cgroup mid-run: the
#      run must move layers off rank 1 (one line naming it and the new cut) and end with the
#      losses and the parameters of `--pp 1` (1e-5);
#   3. four ranks of `--pp 2 --dp 2 --partition workers`, the second copy's two ranks in the
#      cgroup from their start: the copies must take unequal shares of the batch (`shares A,B`
#      on the stage layers' line, the slow copy the smaller) and the run must print the losses
#      of `--pp 1` (1e-5).
#
#   bash tests/slow_worker_test.sh PPTRAIN_BINARY
#
# Needs root and the CPU controller of cgroups; without them it exits 77 (CTest: skipped) and
# says what is missing.
set -uo pipefail
binary=$1
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/tests/slow_rank.sh"

skip() { echo "skipped: $*"; exit 77; }
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  slow_cgroup_remove
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; for f in "$dir"/*.err; do echo "--- $f"; cat "$f"; done; exit 1; }

slow_cgroup_make "pptrain-slow-$$" 0.33 || skip "$slow_cgroup_missing"
port=$("${PPTRAIN_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

train="train --model gpt --layers 8 --d-model 64 --heads 4 --seq-len 16 --batch-size 8
       --microbatches 4 --steps 3 --quiet"
"$binary" $train --pp 1 --metrics "$dir/one.jsonl" >/dev/null 2>"$dir/one.err" ||
  fail "the --pp 1 run"

# Rank r of the 2-rank run; rank 1 enters the slow group before it executes pptrain.
# start_rank R EXTRA_FLAGS COMMAND...: COMMAND is the binary, or what executes it.
start_rank() {
  local r=$1 extra=$2
  shift 2
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 RANK="$r" LOCAL_RANK="$r" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    PPTRAIN_COMM_TIMEOUT_S=60 timeout 150 "$@" $train --pp 2 --partition workers $extra \
    --metrics "$dir/workers$r.jsonl" >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
  pids+=($!)
}
start_rank 0 "--save-workers $dir/workers.json" "$binary"
start_rank 1 "" sh -c 'echo $$ > "$0" && exec "$@"' "$slow_cgroup_procs" "$binary"
wait "${pids[0]}" || fail "rank 0 exited $?"
wait "${pids[1]}" || fail "rank 1 exited $?"

err="$dir/rank0.err"
speed() { sed -n "s/^pptrain: --partition workers: rank $1: speed \([0-9.]*\).*/\1/p" "$err"; }
s0=$(speed 0)
s1=$(speed 1)
[ -n "$s0" ] && [ -n "$s1" ] || fail "rank 0 printed no line per rank"
grep "^pptrain: --partition workers: rank" "$err"
awk -v a="$s0" -v b="$s1" 'BEGIN { exit !(a == 1 && b < 0.6) }' ||
  fail "rank 1 should measure well below rank 0: $s0 and $s1"
# What rank 0 measured, as `pptrain plan --workers-profile` reads it.
"$binary" partition --profile "$root/data/pipedream/vgg16/graph.txt" --method time --pp 2 \
  --workers-profile "$dir/workers.json" >/dev/null || fail "--save-workers wrote no workers profile"
layers=$(sed -n 's/^pptrain: --partition workers: stage layers \([0-9][0-9,-]*[0-9]\).*/\1/p' "$err")
echo "stage layers: $layers"
grep -Eq "^pptrain: --partition workers: stage layers $layers(, placement [0-9,]*)?, predicted step [0-9.]* ms$" "$err" ||
  fail "rank 0 printed no predicted step time"
# The run may place the workers otherwise ("placement 1,0": worker 1 runs stage 0); the process
# that runs stage 0 writes the metrics.
placement=$(sed -n 's/^pptrain: --partition workers: stage layers .*, placement \([0-9,]*\),.*/\1/p' "$err")
placement=${placement:-0,1}
echo "placement: $placement"
count() { awk -F'[-,]' -v s="$2" '{ print $(2 * s + 2) - $(2 * s + 1) + 1 }' <<<"$1"; }
slow_stage=$([ "${placement%%,*}" = 1 ] && echo 0 || echo 1)
slow=$(count "$layers" "$slow_stage")
fast=$(count "$layers" $((1 - slow_stage)))
[ -n "$slow" ] && ((fast > slow)) ||
  fail "the slow worker 1 should hold fewer layers than worker 0: $layers, placement $placement"

losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
[ "$(losses "$dir/one.jsonl" | wc -l)" = 3 ] || fail "the --pp 1 run wrote no 3 losses"
paste <(losses "$dir/one.jsonl") <(losses "$dir/workers${placement%%,*}.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (d > 1e-5 * s) bad = 1; n++ }
  END { exit bad || n != 3 }' || fail "the losses differ from --pp 1"
echo "--partition workers: the slow rank holds fewer layers, and the losses are those of --pp 1"

# 2. --replan auto, rank 1 slowed mid-run.
steps=40
# Steps of several of the CPU controller's 100 ms periods, so that a step's compute time shows
# the rank's share of a core rather than whether a pause fell into it.
train="train --model gpt --layers 8 --d-model 256 --heads 4 --seq-len 64 --batch-size 16
       --microbatches 4 --steps $steps --quiet"
"$binary" $train --pp 1 --metrics "$dir/one2.jsonl" --save "$dir/one2" >/dev/null \
  2>"$dir/one2.err" || fail "the --pp 1 run of part 2"
port=$("${PPTRAIN_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" PPTRAIN_COMM_TIMEOUT_S=60 "$binary" $train --pp 2 \
    --replan auto --metrics "$dir/replan.jsonl" --save "$dir/replan" \
    >"$dir/replan$r.out" 2>"$dir/replan$r.err" &
  pids+=($!)
done
# One metrics file for both: a move may give rank 0 to the other process, which goes on in it.
for _ in $(seq 1200); do
  [ "$(cat "$dir/replan.jsonl" 2>/dev/null | wc -l)" -ge 8 ] && break
  sleep 0.05
done
at=$(cat "$dir/replan.jsonl" 2>/dev/null | wc -l)
((at >= 8 && at < steps - 10)) || fail "could not slow rank 1 between steps 8 and $((steps - 10)) (at $at)"
echo "${pids[1]}" >"$slow_cgroup_procs" || fail "cannot move rank 1 into the cgroup"
echo "rank 1 held to a third of a core after step $at"
wait "${pids[0]}" || fail "rank 0 of --replan auto exited $?"
wait "${pids[1]}" || fail "rank 1 of --replan auto exited $?"
# The process playing rank 0 says it; after a move to another placement, the other one.
moves=$(cat "$dir"/replan[01].err | grep "^pptrain: --replan auto after step")
[ -n "$moves" ] || fail "rank 0 did not say it moved layers"
echo "$moves"
grep -m1 "" <<<"$moves" | grep -q "rank 1 computes" || fail "the first move should name rank 1"
# The last move's cut, and the last placement a move named ("placement 1,0": worker 1 plays
# rank 0; a move that names none keeps the one before).
after=$(grep -- "->" <<<"$moves" | tail -1 | sed -n 's/.* -> \([0-9][0-9,-]*[0-9]\)[ ,].*/\1/p')
placement=$(grep -o ", placement [0-9,]*[0-9]" <<<"$moves" | tail -1 | cut -d' ' -f3)
placement=${placement:-0,1}
slow_stage=$([ "${placement%%,*}" = 1 ] && echo 0 || echo 1)
slow=$(count "$after" "$slow_stage")
fast=$(count "$after" $((1 - slow_stage)))
[ -n "$slow" ] && ((fast > slow)) ||
  fail "the new cut should give worker 1 fewer layers: $after, placement $placement"
[ "$(losses "$dir/replan.jsonl" | wc -l)" = $steps ] || fail "--replan auto wrote no $steps losses"
paste <(losses "$dir/one2.jsonl") <(losses "$dir/replan.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (d > 1e-5 * s) bad = 1 }
  END { exit bad }' || fail "the losses of --replan auto differ from --pp 1"
"${PPTRAIN_PYTHON:-python3}" "$root/tests/same_weights.py" "$dir/one2" "$dir/replan" ||
  fail "the parameters of --replan auto differ from --pp 1"
echo "--replan auto: layers moved off the slowed rank, losses and parameters those of --pp 1"

# 3. --dp 2, the second copy (ranks 2 and 3) held together to a third of a core from its start.
train="train --model gpt --layers 8 --d-model 64 --heads 4 --seq-len 16 --batch-size 16
       --microbatches 4 --steps 3 --quiet"
"$binary" $train --pp 1 --metrics "$dir/one3.jsonl" >/dev/null 2>"$dir/one3.err" ||
  fail "the --pp 1 run of part 3"
port=$("${PPTRAIN_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1 2 3; do
  prefix=()
  ((r >= 2)) && prefix=(sh -c 'echo $$ > "$0" && exec "$@"' "$slow_cgroup_procs")
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" PPTRAIN_COMM_TIMEOUT_S=60 timeout 150 \
    "${prefix[@]}" "$binary" $train --pp 2 --dp 2 --partition workers \
    --metrics "$dir/dp$r.jsonl" >"$dir/dp$r.out" 2>"$dir/dp$r.err" &
  pids+=($!)
done
for r in 0 1 2 3; do wait "${pids[$r]}" || fail "rank $r of --dp 2 exited $?"; done
grep "^pptrain: --partition workers:" "$dir/dp0.err"
shares=$(sed -n 's/^pptrain: --partition workers: stage layers .*, shares \([0-9]*\),\([0-9]*\),.*/\1 \2/p' "$dir/dp0.err")
read -r fast_share slow_share <<<"$shares"
[ -n "$slow_share" ] && ((fast_share > slow_share && fast_share + slow_share == 16)) ||
  fail "the slow copy should take the smaller share of the batch of 16: '$shares'"
paste <(losses "$dir/one3.jsonl") <(losses "$dir/dp0.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (d > 1e-5 * s) bad = 1; n++ }
  END { exit bad || n != 3 }' || fail "the losses of --dp 2 with shares differ from --pp 1"
echo "--dp 2 --partition workers: the slow copy takes $slow_share of 16 samples, the losses are those of --pp 1"
