#!/usr/bin/env bash
# Messages between two ranks of one host through shared memory (PPTRAIN_SHM=1, the default)
# against Gloo's TCP alone (PPTRAIN_SHM=0), in one run: `pptrain train --pp 2` of a gpt with small
# actions (short sequences), the two transports alternated ROUNDS times so a noisy neighbour hurts
# both alike.
# Prints the median tokens/s of each (over the steps after the first of every run), shm / gloo,
# and whether the losses of the two are the same bit for bit (they must be: the same bytes move).
#
#   bench/shm_bench.sh [path/to/pptrain]       # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=8 SEQ_LENS="8 32 128" SCHEDULES="1f1b zb-v" bench/shm_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
SEQ_LENS=${SEQ_LENS:-"8 32"}
SCHEDULES=${SCHEDULES:-"1f1b zb-v"}
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --batch-size 32 --microbatches 8"}
[[ -x "$PPTRAIN" ]] || { echo "shm_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
(( STEPS >= 2 )) || { echo "shm_bench: STEPS must be >= 2 (the first step is a warm-up)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/lib.sh  # field, median
losses() { sed -n 's/.*"loss":\([0-9.eE+-]*\).*/\1/p' "$1"; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for seq in $SEQ_LENS; do
    for schedule in $SCHEDULES; do
      for transport in gloo shm; do
        shm=1
        [[ $transport == gloo ]] && shm=0
        PPTRAIN_SHM=$shm "$PPTRAIN" train $MODEL --seq-len "$seq" --pp 2 --schedule "$schedule" \
          --steps "$STEPS" --quiet --metrics "$work/$seq.$schedule.$transport.$round.jsonl" >/dev/null
        # A fallback would compare gloo with gloo: the run must say it used the link measured.
        grep -q "\"links\":{\"0-1\":\"$transport\"}" "$work/$seq.$schedule.$transport.$round.jsonl" ||
          { echo "shm_bench: the $transport run did not link its ranks through $transport" >&2; exit 1; }
      done
    done
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ROUNDS round(s) of $STEPS steps, the first of each excluded; $MODEL"
echo
printf "%-8s %-9s %14s %14s %10s %8s %8s  %s\n" seq-len schedule "gloo tok/s" "shm tok/s" "shm/gloo" \
  "min" "max" "losses"
for seq in $SEQ_LENS; do
  for schedule in $SCHEDULES; do
    gloo=$(for f in "$work/$seq.$schedule.gloo".*.jsonl; do field "$f" tokens_per_s; done | median)
    shm=$(for f in "$work/$seq.$schedule.shm".*.jsonl; do field "$f" tokens_per_s; done | median)
    # The spread: shm / gloo of each round's medians.
    ratios=$(for round in $(seq "$ROUNDS"); do
      g=$(field "$work/$seq.$schedule.gloo.$round.jsonl" tokens_per_s | median)
      s=$(field "$work/$seq.$schedule.shm.$round.jsonl" tokens_per_s | median)
      awk -v a="$s" -v b="$g" 'BEGIN {print a / b}'
    done | sort -g)
    same="same"
    for round in $(seq "$ROUNDS"); do
      cmp -s <(losses "$work/$seq.$schedule.gloo.$round.jsonl") \
        <(losses "$work/$seq.$schedule.shm.$round.jsonl") || same="DIFFERENT"
    done
    printf "%-8s %-9s %14.0f %14.0f %10.3f %8.3f %8.3f  %s\n" "$seq" "$schedule" "$gloo" "$shm" \
      "$(awk -v a="$shm" -v b="$gloo" 'BEGIN {print a / b}')" "$(echo "$ratios" | head -1)" \
      "$(echo "$ratios" | tail -1)" "$same"
  done
done
