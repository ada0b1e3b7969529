#!/usr/bin/env bash
# 2-rank pipelines against what the machine gives two processes at that moment (issue 49): in one
# run, at each sequence length, `--pp 1` alone, two `--pp 1` runs at once (the pair: their
# tokens/s summed), and `--pp 2` under 1f1b and zb-v over Gloo's TCP and over shared memory
# (PPTRAIN_SHM=1). The cases alternate ROUNDS times so that a noisy neighbour hurts them alike.
# Prints the median tokens/s of each (over the steps after the first of every run), the pair's
# ratio to one run (how much the second core gave), and each pipeline's ratio to the pair; and
# which BLAS kernels ran.
#
#   bench/pair_bench.sh [path/to/pptrain]       # default: build/tools/pptrain/pptrain
#   ROUNDS=3 STEPS=6 SEQ_LENS="8 32 128" bench/pair_bench.sh
#
# OPENBLAS_CORETYPE is unset, so that pptrain chooses the kernels itself, as it does for a user
# who sets nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # bench_start, field, median
SEQ_LENS=${SEQ_LENS:-"8 32 128"}
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --batch-size 32 --microbatches 8"}
bench_start pair_bench "${1:-}"
unset OPENBLAS_CORETYPE
pipelines=("1f1b gloo" "1f1b shm" "zb-v gloo" "zb-v shm")

# run NAME SEQ [FLAGS...]: one training run writing $work/NAME.jsonl (and its stdout beside it).
run() {
  local name=$1 seq=$2
  shift 2
  "$PPTRAIN" train $MODEL --seq-len "$seq" --steps "$STEPS" --quiet --metrics "$work/$name.jsonl" \
    "$@" >"$work/$name.out" 2>&1
}

# --quiet runs say nothing of their kernels: one step without it says which ran.
"$PPTRAIN" train $MODEL --seq-len 8 --pp 1 --steps 1 | grep "^BLAS:" ||
  echo "(pptrain named no BLAS kernels)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for seq in $SEQ_LENS; do
    run "$seq.one.$round" "$seq" --pp 1
    run "$seq.pairA.$round" "$seq" --pp 1 &
    first=$!
    run "$seq.pairB.$round" "$seq" --pp 1
    wait "$first"
    for p in "${pipelines[@]}"; do
      read -r schedule transport <<<"$p"
      shm=0
      [[ $transport == shm ]] && shm=1
      PPTRAIN_SHM=$shm run "$seq.$schedule.$transport.$round" "$seq" --pp 2 --schedule "$schedule"
    done
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ROUNDS round(s) of $STEPS steps, the first of each excluded; $MODEL"
echo

# The median tokens/s of the runs matching a pattern, over their steps but the first.
tokens() { for f in "$work"/$1.jsonl; do field "$f" tokens_per_s; done | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf "%-8s %9s %9s %9s" seq-len "one" "pair" "pair/one"
for p in "${pipelines[@]}"; do printf " %14s" "${p/ /,}/pair"; done
echo
for seq in $SEQ_LENS; do
  one=$(tokens "$seq.one.*")
  pair=$(awk -v a="$(tokens "$seq.pairA.*")" -v b="$(tokens "$seq.pairB.*")" 'BEGIN {print a + b}')
  printf "%-8s %9.0f %9.0f %9s" "$seq" "$one" "$pair" "$(ratio "$pair" "$one")"
  for p in "${pipelines[@]}"; do
    read -r schedule transport <<<"$p"
    printf " %14s" "$(ratio "$(tokens "$seq.$schedule.$transport.*")" "$pair")"
  done
  echo
done
