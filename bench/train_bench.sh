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

# Prints the values of one numeric field of a metrics file, skipping the first (warm-up) step.
field() { sed -n "s/.*\"$2\":\([0-9.eE+-]*\).*/\1/p" "$1" | tail -n +2; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for config in "${configs[@]}"; do
    name=${config%%:*}
    "$PPTRAIN" train $MODEL ${config#*:} --steps "$STEPS" --quiet --metrics "$work/$name.$round.jsonl"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

printf "%-10s %12s %10s %14s\n" config tokens/s ratio bubble
base=""
for config in "${configs[@]}"; do
  name=${config%%:*}
  tokens=$(for f in "$work/$name".*.jsonl; do field "$f" tokens_per_s; done | median)
  bubble=$(for f in "$work/$name".*.jsonl; do field "$f" bubble_ratio; done | median)
  base=${base:-$tokens}
  printf "%-10s %12.0f %9.2fx %14.3f\n" "$name" "$tokens" "$(awk -v a="$tokens" -v b="$base" 'BEGIN {print a / b}')" "$bubble"
done
