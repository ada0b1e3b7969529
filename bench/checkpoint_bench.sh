#!/usr/bin/env bash
# What a checkpoint costs the step loop: checkpoint_stall_s (the seconds a step waited for its
# save) of background saves (the default: the rank's state copied to memory, written by a
# thread while training goes on) against synchronous ones (--sync-save), on the gpt of
# bench/zb_bench.sh (8 layers x d_model 256) at --pp 2 with --save-every 2, runs alternated
# ROUNDS times; and the tokens/s of each beside a run that does not save. The run's last save is
# left out (it waits for the write in both).
#
#   bench/checkpoint_bench.sh [path/to/pptrain]     # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=12 bench/checkpoint_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
STEPS=${STEPS:-10}
bench_start checkpoint_bench "${1:-}"

configs=("none:--pp 2 --schedule 1f1b"
         "background:--pp 2 --schedule 1f1b --save-every 2 --save $work/background"
         "sync:--pp 2 --schedule 1f1b --save-every 2 --sync-save --save $work/sync")

run_rounds
echo "$ROUNDS round(s) of $STEPS steps; $MODEL; --save-every 2"
echo
# The stalls of the saving steps but the last, over every round.
stalls() {
  for f in "$work/$1".*.jsonl; do
    sed -n 's/.*"checkpoint_stall_s":\([0-9.eE+-]*\).*/\1/p' "$f" | sed '$d' | awk '$1 > 0'
  done
}
printf "%-11s %10s %18s %10s\n" config tokens/s "median stall (s)" "saves"
for config in "${configs[@]}"; do
  name=${config%%:*}
  if [[ $name == none ]]; then
    printf "%-11s %10.0f %18s %10s\n" "$name" "$(median_field "$name" tokens_per_s)" - -
  else
    printf "%-11s %10.0f %18.4f %10d\n" "$name" "$(median_field "$name" tokens_per_s)" \
      "$(stalls "$name" | median)" "$(stalls "$name" | wc -l)"
  fi
done
echo
printf "background stall / synchronous stall = %.3f\n" \
  "$(awk -v a="$(stalls background | median)" -v b="$(stalls sync | median)" 'BEGIN {print a / b}')"
du -sh "$work/background" | awk '{print "one checkpoint: " $1}'
