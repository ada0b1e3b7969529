#!/usr/bin/env bash
# Throughput of the asynchronous schedules against their own one-process runs and against 1F1B.
# The gpt of bench/zb_bench.sh (8 layers, d-model 256, seq-len 128, batch 8, M 8), one compute
# thread per process, runs alternated ROUNDS times. For each schedule: 2 ranks (--pp 2) and the
# same rule in one process (--pp 1 --stages 2: the same updates, no pipelining). Prints the
# median tokens/s over the steps after the first of every run and the ratio of the pipelined run
# to its own one-process run.
#
#   bench/async_bench.sh [path/to/pptrain]      # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=10 bench/async_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"}
[[ -x "$PPTRAIN" ]] || { echo "async_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
(( STEPS >= 2 )) || { echo "async_bench: STEPS must be >= 2 (the first step is a warm-up)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

schedules=(1f1b pipedream 2bw pipemare)
configs=()
for s in "${schedules[@]}"; do
  configs+=("$s-1:--pp 1 --stages 2 --schedule $s" "$s-2:--pp 2 --schedule $s")
done

source bench/lib.sh
run_rounds
echo "$ROUNDS round(s) of $STEPS steps; $MODEL"
echo
printf "%-10s %18s %18s %10s\n" schedule "1 process tokens/s" "2 ranks tokens/s" "2 / 1"
for s in "${schedules[@]}"; do
  one=$(median_field "$s-1" tokens_per_s)
  two=$(median_field "$s-2" tokens_per_s)
  printf "%-10s %18.0f %18.0f %9.2fx\n" "$s" "$one" "$two" "$(awk -v a="$two" -v b="$one" 'BEGIN {print a / b}')"
done
