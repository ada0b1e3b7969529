#!/usr/bin/env bash
# Zero-bubble training throughput and the simulator's prediction of it. The same gpt as
# bench/train_bench.sh (8 layers, d-model 256, seq-len 128, batch 8, M 8), one compute thread per
# process, runs alternated ROUNDS times so a noisy neighbour hurts every configuration alike:
#   --pp 1, and --pp 2 with 1f1b, zb-h1, zb-h2 and zb-v, and zb-v and zb-auto with
#   --post-validation and the time-balanced partition, each --pp 2 run with --compare-sim.
# Prints, per configuration, the median tokens/s (over the steps after the first of every run)
# and its ratio to --pp 1, and the schedule's makespan as predicted from the run's own per-stage
# times against as measured (both medians over the rounds). Then the split-backward check from
# the same runs: per stage, I and W of zb-h1 against the fused B of 1f1b.
#
#   bench/zb_bench.sh [path/to/pptrain]      # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=8 bench/zb_bench.sh build/tools/pptrain/pptrain
#   MODEL="--model gpt --layers 4 --d-model 64 --heads 4 --seq-len 32 --batch-size 8 --microbatches 4" \
#     ROUNDS=1 STEPS=3 bench/zb_bench.sh build/tools/pptrain/pptrain    # a quick smoke run
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_start zb_bench "${1:-}"

configs=("pp1:--pp 1 --schedule 1f1b"
         "pp2-1f1b:--pp 2 --schedule 1f1b --compare-sim"
         "pp2-zb-h1:--pp 2 --schedule zb-h1 --compare-sim"
         "pp2-zb-h2:--pp 2 --schedule zb-h2 --compare-sim"
         "pp2-zb-v:--pp 2 --schedule zb-v --compare-sim"
         "pp2-zb-v-pv:--pp 2 --schedule zb-v --post-validation --partition time --compare-sim"
         "pp2-zb-auto-pv:--pp 2 --schedule zb-auto --post-validation --partition time --compare-sim")


# One field of the compare_sim object on the last line; for an array, entry $3 (0-based).
compare() {
  local line
  line=$(tail -n 1 "$1")
  if [[ $# -eq 2 ]]; then
    sed -n "s/.*\"$2\":\([0-9.eE+-]*\).*/\1/p" <<<"$line"
  else
    sed -n "s/.*\"$2\":\[\([^]]*\)\].*/\1/p" <<<"$line" | cut -d, -f$(($3 + 1))
  fi
}
over_rounds() { local name=$1; shift; for f in "$work/$name".*.jsonl; do compare "$f" "$@"; done | median; }

run_rounds
echo "$ROUNDS round(s) of $STEPS steps; $MODEL"
echo

printf "%-10s %10s %7s %10s %15s %14s %11s\n" config tokens/s ratio bubble "predicted ms" "measured ms" prediction
base=""
for config in "${configs[@]}"; do
  name=${config%%:*}
  tokens=$(median_field "$name" tokens_per_s)
  bubble=$(median_field "$name" bubble_ratio)
  base=${base:-$tokens}
  ratio=$(awk -v a="$tokens" -v b="$base" 'BEGIN {print a / b}')
  if [[ $name == pp1 ]]; then
    printf "%-10s %10.0f %6.2fx %10.3f %15s %14s %11s\n" "$name" "$tokens" "$ratio" "$bubble" - - -
  else
    predicted=$(over_rounds "$name" predicted_makespan_s)
    measured=$(over_rounds "$name" measured_makespan_s)
    printf "%-10s %10.0f %6.2fx %10.3f %15.1f %14.1f %+10.1f%%\n" "$name" "$tokens" "$ratio" "$bubble" \
      "$(awk -v x="$predicted" 'BEGIN {print x * 1e3}')" "$(awk -v x="$measured" 'BEGIN {print x * 1e3}')" \
      "$(awk -v p="$predicted" -v m="$measured" 'BEGIN {print (p - m) / m * 100}')"
  fi
done
echo "(makespan: first action to last of the schedule, without the optimizer step;"
echo " predicted: the schedule simulated with the run's own median per-stage F, I, W, B and comm latency)"
echo

# The split costs nothing extra when I + W of zb-h1 is within 15% of 1f1b's fused B on each stage.
echo "split backward, per stage (ms; medians over the rounds): zb-h1's I and W against 1f1b's B"
printf "%-6s %9s %9s %9s %9s %8s %9s\n" stage "B" "I" "W" "I+W" "I/B" "(I+W)/B"
for stage in 0 1; do
  b=$(over_rounds pp2-1f1b stage_backward_s "$stage")
  i=$(over_rounds pp2-zb-h1 stage_backward_input_s "$stage")
  w=$(over_rounds pp2-zb-h1 stage_backward_weight_s "$stage")
  awk -v s="$stage" -v b="$b" -v i="$i" -v w="$w" \
    'BEGIN {printf "%-6s %9.3f %9.3f %9.3f %9.3f %8.2f %9.2f\n", s, b * 1e3, i * 1e3, w * 1e3, (i + w) * 1e3, i / b, (i + w) / b}'
done
