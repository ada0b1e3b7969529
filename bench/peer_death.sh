#!/usr/bin/env bash
# How a rank ends when its peer dies mid-run: two `pptrain train` ranks started as torchrun
# would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one of them killed with SIGKILL at a
# random moment of its steps, N times. Counts the survivor's endings: its exit status (or the
# signal that ended it) and the last line of its stderr. The rule is one line naming the lost
# rank and status 1, never an abort (signal 6).
#
#   bench/peer_death.sh [build folder] [runs] [victim rank]   # default: build 20 0
#   MODEL="--model gpt --layers 4 --d-model 256 ..." sets the model (default: a small gpt).
#   CRASH_STEP=k: the victim aborts by itself at the start of step k (PPTRAIN_TEST_CRASH_RANK)
#   instead of being killed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-20}
victim=${3:-0}
survivor=$((1 - victim))
binary="$build/tools/pptrain/pptrain"
[[ -x "$binary" ]] || { echo "peer_death: no pptrain at '$binary' (build first)" >&2; exit 2; }
source tests/process_groups.sh
model=${MODEL:-"--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8"}
args="train $model --microbatches 4 --pp 2 --schedule 1f1b --steps 100000 --quiet --threads 1
      --metrics $dir/metrics.jsonl"
declare -A endings
for ((run = 0; run < runs; run++)); do
  port=$(free_port)
  rm -f "$dir/metrics.jsonl"
  declare -A pid=()
  for rank in 0 1; do
    RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port PPTRAIN_COMM_TIMEOUT_S=${PPTRAIN_COMM_TIMEOUT_S:-20} \
      PPTRAIN_TEST_CRASH_RANK=$victim PPTRAIN_TEST_CRASH_STEP=${CRASH_STEP:--1} \
      setsid "$binary" $args >"$dir/$rank.out" 2>"$dir/$rank.err" &
    pid[$rank]=$!
    groups+=("$!")
  done
  if [[ -z "${CRASH_STEP:-}" ]]; then
    # Past the rendezvous and the first step, then a random moment within the steps.
    for ((i = 0; i < 600; i++)); do
      [[ -s "$dir/metrics.jsonl" ]] && break
      sleep 0.05
    done
    sleep "$(awk -v s=$RANDOM 'BEGIN { printf "%.3f", (s % 800) / 1000 }')"
    kill -KILL "${pid[$victim]}"
  fi
  status=0
  timeout 90 tail --pid="${pid[$survivor]}" -f /dev/null
  wait "${pid[$survivor]}" || status=$?
  wait "${pid[$victim]}" 2>/dev/null
  last=$(grep -v '^\s*$' "$dir/$survivor.err" | grep -v '^#\|^  ' | tail -n 1 |
    sed -E 's/\[[0-9a-f.:]*\]:[0-9]+/[addr]/g; s/pair\.cc:[0-9]+/pair.cc/' | cut -c1-200)
  if ((status > 128)); then how="signal $((status - 128))"; else how="exit $status"; fi
  key="$how | $last"
  endings[$key]=$((${endings[$key]:-0} + 1))
  if ((status > 128)); then cp "$dir/$survivor.err" "/tmp/peer_death_abort_$run.err"; fi
done
echo "rank $survivor after rank $victim was killed, $runs runs:"
for key in "${!endings[@]}"; do printf '%4d  %s\n' "${endings[$key]}" "$key"; done | sort -rn
