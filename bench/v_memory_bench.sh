#!/usr/bin/env bash
# Peak activation memory of the V schedules (v-half, v-min, dualpipev) against 1f1b and zb-v in real
# training runs. Memory is deterministic, so one run of STEPS steps per (schedule, --pp) is
# enough. Prints, per run, the largest rank's peak_activation_bytes (the metrics' figure: bytes
# allocated during the step above its start), its ratio to 1f1b's at the same --pp, and the
# simulator's largest peak_activations for the same schedule (microbatches of a rank's share).
#
#   bench/v_memory_bench.sh [path/to/pptrain]      # default: build/tools/pptrain/pptrain
#   PPS="2 4" STEPS=2 bench/v_memory_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
PPS=${PPS:-"4 8"}
STEPS=${STEPS:-2}
SCHEDULES=${SCHEDULES:-"1f1b zb-v v-half v-min dualpipev"}
MICROBATCHES=${MICROBATCHES:-16}
MODEL=${MODEL:-"--model gpt --layers 16 --d-model 128 --heads 4 --seq-len 128 --batch-size 16"}
[[ -x "$PPTRAIN" ]] || { echo "v_memory_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The largest entry of a JSON array field on the last line of a file.
largest() { tail -n 1 "$1" | sed -n "s/.*\"$2\":\[\([^]]*\)\].*/\1/p" | tr , '\n' | sort -g | tail -n 1; }

echo "$MODEL --microbatches $MICROBATCHES, $STEPS steps"
printf "%-5s %-10s %12s %9s %15s\n" pp schedule "peak MiB" "vs 1f1b" "simulated peak"
for pp in $PPS; do
  base=""
  for s in $SCHEDULES; do
    "$PPTRAIN" train $MODEL --microbatches "$MICROBATCHES" --pp "$pp" --schedule "$s" \
      --steps "$STEPS" --quiet --metrics "$work/$s.$pp.jsonl" >/dev/null
    bytes=$(largest "$work/$s.$pp.jsonl" peak_activation_bytes)
    base=${base:-$bytes}
    "$PPTRAIN" schedule --schedule "$s" --pp "$pp" --microbatches "$MICROBATCHES" --json \
      | tr -d ' \n' | sed 's/"peak_activations":/\n/g' | sed -n '2,$s/^\([0-9.]*\).*/\1/p' \
      >"$work/sim"
    awk -v pp="$pp" -v s="$s" -v b="$bytes" -v base="$base" -v sim="$(sort -g "$work/sim" | tail -n 1)" \
      'BEGIN {printf "%-5s %-10s %12.1f %8.2fx %15s\n", pp, s, b / 1048576, b / base, sim}'
  done
done
