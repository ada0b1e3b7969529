#!/usr/bin/env bash
# fp32 against bf16 and fp16 (`pptrain train --precision`, docs/CLI.md "Precision"): how close
# their training ends, and how fast each computes on this CPU.
#   1. Convergence: gpt 8 layers x d_model 256 for LONG_STEPS steps (default 300) at each
#      precision, the same seed and data, on --pp 2 with 1f1b: the final loss (the mean of the
#      last 10 steps' losses, which smooths one batch's luck) and its difference to fp32's.
#   2. Speed: ROUNDS rounds of STEPS steps of each precision, alternated, the median tokens/s
#      over the steps after the first of every round, its ratio to fp32's, and the bytes sent
#      per step on rank 0; bf16 and fp16 also with --weight-casts step (each weight cast once
#      per step, not at every use: the rows "bf16 step", "fp16 step", and their ratio to the
#      same precision's casts per use).
# Prints the kernels that ran (the run's `kernels:` line) and the load before and after.
#
#   bench/precision_bench.sh [path/to/pptrain]
#   LONG_STEPS=300 ROUNDS=3 STEPS=8 bench/precision_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # bench_start, field, median, median_field, run_rounds
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 32 --batch-size 16 --microbatches 4"}
LONG_STEPS=${LONG_STEPS:-300}
LAYOUT=${LAYOUT:-"--pp 2 --schedule 1f1b"}
bench_start precision_bench "${1:-}"
precisions="fp32 bf16 fp16"

"$PPTRAIN" train $MODEL $LAYOUT --steps 1 | grep "^kernels:" || echo "(pptrain named no kernels)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for p in $precisions; do
  "$PPTRAIN" train $MODEL $LAYOUT --precision "$p" --steps "$LONG_STEPS" --quiet \
    --metrics "$work/long.$p.jsonl" > /dev/null
done
# The mean of the last 10 losses of a metrics file.
final_loss() { sed -n 's/.*"loss":\([0-9.eE+-]*\).*/\1/p' "$1" | tail -n 10 | awk '{s += $1} END {printf "%.4f", s / NR}'; }
echo "$LONG_STEPS steps, $MODEL $LAYOUT"
printf '%-10s %12s %12s\n' precision "final loss" "vs fp32"
reference=$(final_loss "$work/long.fp32.jsonl")
for p in $precisions; do
  loss=$(final_loss "$work/long.$p.jsonl")
  printf '%-10s %12s %+11.2f%%\n' "$p" "$loss" "$(awk -v a="$loss" -v b="$reference" 'BEGIN {print 100 * (a - b) / b}')"
done
skipped=$(grep -c '"skipped":true' "$work/long.fp16.jsonl" || true)
echo "fp16 skipped $skipped of $LONG_STEPS steps (overflows); its last loss scale $(sed -n 's/.*"loss_scale":\([0-9.eE+-]*\).*/\1/p' "$work/long.fp16.jsonl" | tail -n 1)"

configs=()
for p in $precisions; do configs+=("$p:$LAYOUT --precision $p"); done
configs+=("bf16-step:$LAYOUT --precision bf16 --weight-casts step")
configs+=("fp16-step:$LAYOUT --precision fp16 --weight-casts step")
run_rounds
echo "$ROUNDS round(s) of $STEPS steps, the first of each excluded"
printf '%-10s %12s %10s %16s %14s\n' precision tokens/s "vs fp32" "bytes sent r0" "vs per use"
base=$(median_field fp32 tokens_per_s)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }
for name in $precisions bf16-step fp16-step; do
  rate=$(median_field "$name" tokens_per_s)
  sent=$(sed -n 's/.*"bytes_sent":\[\([0-9]*\).*/\1/p' "$work/$name.1.jsonl" | tail -n 1)
  per_use=""
  [ "${name%-step}" != "$name" ] && per_use=$(ratio "$rate" "$(median_field "${name%-step}" tokens_per_s)")
  printf '%-10s %12.0f %10s %16s %14s\n' "${name/-/ }" "$rate" "$(ratio "$rate" "$base")" "$sent" "$per_use"
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
