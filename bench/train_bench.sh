#!/usr/bin/env bash
# Training throughput: the same gpt (8 layers, d-model 256, seq-len 128, batch 8, M 8) with
# --pp 1 and with --pp 2 (1f1b and gpipe), one compute thread per process, runs alternated
# ROUNDS times so a noisy neighbour hurts every configuration alike. Prints the median tokens/s
# of each (over the steps after the first of every run) and the ratio to --pp 1.
# The ideal on two cores is 2.0x less the bubble.
#
#   bench/train_bench.sh [path/to/pptrain]      # default: build/tools/pptrain/pptrain
#   ROUNDS=5 STEPS=8 bench/train_bench.sh build/tools/pptrain/pptrain
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
MODEL="--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"
[[ -x "$PPTRAIN" ]] || { echo "train_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

configs=("pp1:--pp 1 --schedule 1f1b" "pp2-1f1b:--pp 2 --schedule 1f1b" "pp2-gpipe:--pp 2 --schedule gpipe")

source bench/lib.sh
run_rounds

printf "%-10s %12s %10s %14s\n" config tokens/s ratio bubble
base=""
for config in "${configs[@]}"; do
  name=${config%%:*}
  tokens=$(median_field "$name" tokens_per_s)
  bubble=$(median_field "$name" bubble_ratio)
  base=${base:-$tokens}
  printf "%-10s %12.0f %9.2fx %14.3f\n" "$name" "$tokens" "$(awk -v a="$tokens" -v b="$base" 'BEGIN {print a / b}')" "$bubble"
done
