#!/usr/bin/env bash
# --weight-casts step against the default (each use casts the weight), at bf16: gpt 8 layers x
# d_model 256 at seq 32 in microbatches of one sample (16 a step), where a weight's casts are
# the largest share of the work, on --pp 2 with 1f1b and zb-v. ROUNDS rounds of STEPS steps of
# each configuration, alternated; prints the median tokens/s over the steps after the first of
# every run, each rank's peak (the counting allocator's), and step / per use.
#
#   bench/weight_casts_bench.sh [path/to/pptrain]
#   ROUNDS=3 STEPS=8 PRECISION=bf16 bench/weight_casts_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # bench_start, median_field, run_rounds
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 32 --batch-size 16 --microbatches 16"}
PRECISION=${PRECISION:-bf16}
bench_start weight_casts_bench "${1:-}"
schedules="1f1b zb-v"
"$PPTRAIN" train $MODEL --pp 2 --steps 1 --precision "$PRECISION" | grep "^kernels:" || true
configs=()
for s in $schedules; do
  configs+=("use-$s:--pp 2 --schedule $s --precision $PRECISION")
  configs+=("step-$s:--pp 2 --schedule $s --precision $PRECISION --weight-casts step")
done
run_rounds
echo "$MODEL --pp 2 --precision $PRECISION; $ROUNDS round(s) of $STEPS steps, the first of each excluded"
peaks() { sed -n 's/.*"peak_memory_bytes":\[\([0-9,]*\)\].*/\1/p' "$work/$1.1.jsonl" | tail -n 1 |
  tr ',' '\n' | awk '{printf "%s%.1f", (NR > 1 ? " / " : ""), $1 / 1048576}'; }
printf '%-8s %-12s %10s %22s %12s\n' schedule "weight casts" tokens/s "peak MiB per rank" "step/use"
for s in $schedules; do
  use=$(median_field "use-$s" tokens_per_s)
  step=$(median_field "step-$s" tokens_per_s)
  printf '%-8s %-12s %10.0f %22s %12s\n' "$s" "per use" "$use" "$(peaks "use-$s")" ""
  printf '%-8s %-12s %10.0f %22s %11.2fx\n' "$s" "per step" "$step" "$(peaks "step-$s")" \
    "$(awk -v a="$step" -v b="$use" 'BEGIN {print a / b}')"
done
