#!/usr/bin/env bash
# The two ways of splitting a backward into I and W, side by side on the same runs: pptrain's
# PipeLinear layers deferring their weight gradients (`--weight-split deferred`, the fast path)
# against the way any module is split (`--weight-split autograd`: autograd's input gradient
# first with the graph kept, then a second pass for the weights', as the library does for a
# program's own model). The gpt of bench/zb_bench.sh, --pp 2, zb-h1 and zb-v, runs alternated
# ROUNDS times. Prints the median tokens/s of each and the autograd/deferred ratio per schedule,
# and the 1f1b run (no split) as the yardstick.
#
#   bench/weight_split_bench.sh [path/to/pptrain]     # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=8 bench/weight_split_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_start weight_split_bench "${1:-}"

configs=("1f1b:--pp 2 --schedule 1f1b"
         "zb-h1-deferred:--pp 2 --schedule zb-h1 --weight-split deferred"
         "zb-h1-autograd:--pp 2 --schedule zb-h1 --weight-split autograd"
         "zb-v-deferred:--pp 2 --schedule zb-v --weight-split deferred"
         "zb-v-autograd:--pp 2 --schedule zb-v --weight-split autograd")

run_rounds
echo "$ROUNDS round(s) of $STEPS steps; $MODEL"
echo
printf "%-16s %10s %8s %10s\n" config tokens/s bubble "vs 1f1b"
base=$(median_field 1f1b tokens_per_s)
for config in "${configs[@]}"; do
  name=${config%%:*}
  tokens=$(median_field "$name" tokens_per_s)
  printf "%-16s %10.0f %8.3f %9.2fx\n" "$name" "$tokens" "$(median_field "$name" bubble_ratio)" \
    "$(awk -v a="$tokens" -v b="$base" 'BEGIN {print a / b}')"
done
echo
for schedule in zb-h1 zb-v; do
  deferred=$(median_field "$schedule-deferred" tokens_per_s)
  autograd=$(median_field "$schedule-autograd" tokens_per_s)
  printf "%s: autograd split / deferred split = %.3f\n" "$schedule" \
    "$(awk -v a="$autograd" -v b="$deferred" 'BEGIN {print a / b}')"
done
