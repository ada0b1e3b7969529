#!/usr/bin/env bash
# 2-rank pipelines against what the machine gives two processes at that moment (issue 49): in one
# run, at each sequence length, `--pp 1` alone, two `--pp 1` runs at once (the pair: their
# tokens/s summed), and `--pp 2` under 1f1b and zb-v over Gloo's TCP (PPTRAIN_SHM=0) and over
# shared memory (the default). The cases alternate ROUNDS times so that a noisy neighbour hurts
# them alike.
# Prints the median tokens/s of one run and of the pair (over the steps after the first of every
# run), the pair's ratio to one run (how much the second core gave), and each pipeline's ratio
# to the pair of its own round (the median over the rounds, and their range); and which kernels
# ran (the run's `kernels:` line, device/kernels.h).
#
#   bench/pair_bench.sh [path/to/pptrain]       # default: build/tools/pptrain/pptrain
#   ROUNDS=3 STEPS=6 SEQ_LENS="8 32 128" TRANSPORTS="gloo shm" bench/pair_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # bench_start, field, median
SEQ_LENS=${SEQ_LENS:-"8 32 128"}
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --batch-size 32 --microbatches 8"}
bench_start pair_bench "${1:-}"
# TRANSPORTS="shm" leaves Gloo's runs out: shorter rounds, which the machine's drift spares more.
pipelines=()
for schedule in 1f1b zb-v; do
  for transport in ${TRANSPORTS:-gloo shm}; do pipelines+=("$schedule $transport"); done
done

# run NAME SEQ [FLAGS...]: one training run writing $work/NAME.jsonl (and its stdout beside it).
run() {
  local name=$1 seq=$2
  shift 2
  "$PPTRAIN" train $MODEL --seq-len "$seq" --steps "$STEPS" --quiet --metrics "$work/$name.jsonl" \
    "$@" >"$work/$name.out" 2>&1
}

# pair SEQ TAG: two `--pp 1` runs at once, writing SEQ.pairA.TAG and SEQ.pairB.TAG. Each round
# has one before its pipelines and one after, so a drift of the machine's rate meanwhile
# weighs on the pair as on them.
pair() {
  run "$1.pairA.$2" "$1" --pp 1 &
  local first=$!
  run "$1.pairB.$2" "$1" --pp 1
  wait "$first"
}

# --quiet runs say nothing of their kernels: one step without it says which ran.
"$PPTRAIN" train $MODEL --seq-len 8 --pp 1 --steps 1 | grep "^kernels:" ||
  echo "(pptrain named no kernels)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for seq in $SEQ_LENS; do
    run "$seq.one.$round" "$seq" --pp 1
    pair "$seq" "${round}a"
    for p in "${pipelines[@]}"; do
      read -r schedule transport <<<"$p"
      shm=0
      [[ $transport == shm ]] && shm=1
      PPTRAIN_SHM=$shm run "$seq.$schedule.$transport.$round" "$seq" --pp 2 --schedule "$schedule"
    done
    pair "$seq" "${round}b"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ROUNDS round(s) of $STEPS steps, the first of each excluded; $MODEL"
echo

# The median tokens/s of the runs matching a pattern, over their steps but the first.
tokens() { for f in "$work"/$1.jsonl; do field "$f" tokens_per_s; done | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
# A pipeline's ratio to the pairs of the same round (before and after it), one line per round:
# the machine's rate drifts over minutes, so a ratio is taken between runs close in time.
round_ratios() {
  local seq=$1 name=$2 round pair
  for round in $(seq "$ROUNDS"); do
    pair=$(awk -v a="$(tokens "$seq.pairA.$round?")" -v b="$(tokens "$seq.pairB.$round?")" \
      'BEGIN {print a + b}')
    ratio "$(tokens "$seq.$name.$round")" "$pair"
    echo
  done
}
# "median (min-max)" of numbers, one per line.
spread() { sort -g | awk '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
  printf "%.2f (%.2f-%.2f)", m, v[1], v[NR]}'; }
echo "pipeline/pair: the median of the rounds' ratios (each to its own round's pair), min-max"
printf "%-8s %7s %7s %8s" seq-len "one" "pair" "pair/one"
for p in "${pipelines[@]}"; do printf " %18s" "${p/ /,}/pair"; done
echo
for seq in $SEQ_LENS; do
  one=$(tokens "$seq.one.*")
  pair=$(awk -v a="$(tokens "$seq.pairA.*")" -v b="$(tokens "$seq.pairB.*")" 'BEGIN {print a + b}')
  printf "%-8s %7.0f %7.0f %8.2f" "$seq" "$one" "$pair" "$(ratio "$pair" "$one")"
  for p in "${pipelines[@]}"; do
    read -r schedule transport <<<"$p"
    printf " %18s" "$(round_ratios "$seq" "$schedule.$transport" | spread)"
  done
  echo
done
