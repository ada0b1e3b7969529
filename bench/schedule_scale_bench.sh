#!/usr/bin/env bash
# How `pptrain schedule --json` scales with the pipeline: zb-v (2 stages per rank, F, I and W of
# every microbatch: 6 P M compute actions) generated, lowered, validated and simulated, the
# summary printed. For each binary given (the first is the reference the ratios are taken to):
#   - zb-v P=64 M=512: wall time and peak resident memory (best of ROUNDS runs), and the bytes
#     per compute action above a tiny run's (1f1b P=2 M=2, the program and its libraries);
#   - P = 32, 64, 128, 256 with M = 8P: time per compute action (wall time less the tiny run's),
#     which stays about constant when the work is linear in the actions.
#
#   bench/schedule_scale_bench.sh OLD_BINARY NEW_BINARY
#   ROUNDS=3 SIZES="32 64 128 256" bench/schedule_scale_bench.sh build/tools/pptrain/pptrain
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 1)) || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-32 64 128 256}
for b in "$@"; do [[ -x "$b" ]] || { echo "schedule_scale_bench: no binary at '$b'" >&2; exit 2; }; done
export OPENBLAS_NUM_THREADS=1

# Best wall time (s, from the clock around the run) and the peak resident set (KiB, from
# /usr/bin/time) of that run: "<seconds> <kib>".
best_run() {
  local best="" kib="" start end wall k
  for _ in $(seq "$ROUNDS"); do
    start=$(date +%s.%N)
    k=$(/usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1)
    end=$(date +%s.%N)
    wall=$(echo "$end - $start" | bc)
    if [[ -z "$best" ]] || (($(echo "$wall < $best" | bc))); then
      best=$wall
      kib=$k
    fi
  done
  echo "$best $kib"
}

declare -A seconds kib
for b in "$@"; do
  read -r s k < <(best_run "$b" schedule --schedule 1f1b --pp 2 --microbatches 2 --json)
  seconds[$b,tiny]=$s kib[$b,tiny]=$k
  read -r s k < <(best_run "$b" schedule --schedule zb-v --pp 64 --microbatches 512 --json)
  seconds[$b,zbv]=$s kib[$b,zbv]=$k
done
actions=$((6 * 64 * 512))
ref=$1
echo "zb-v P=64 M=512 ($actions compute actions), best of $ROUNDS:"
for b in "$@"; do
  per=$(((kib[$b,zbv] - kib[$b,tiny]) * 1024 / actions))
  printf "  %-40s %6.3f s  %7d KiB peak  %4d bytes per compute action  time ratio %.1fx\n" \
    "$b" "${seconds[$b,zbv]}" "${kib[$b,zbv]}" "$per" \
    "$(echo "${seconds[$ref,zbv]} / ${seconds[$b,zbv]}" | bc -l)"
done
echo "zb-v with M = 8P, time per compute action (wall time less the tiny run's):"
for b in "$@"; do
  line="  $b:" least="" most=""
  for p in $SIZES; do
    m=$((8 * p))
    read -r s k < <(best_run "$b" schedule --schedule zb-v --pp "$p" --microbatches "$m" --json)
    n=$((6 * p * m))
    ns=$(echo "($s - ${seconds[$b,tiny]}) * 1000000000 / $n" | bc -l)
    line+=$(printf "  P=%d %.0f ns" "$p" "$ns")
    if [[ -z "$least" ]] || (($(echo "$ns < $least" | bc))); then least=$ns; fi
    if [[ -z "$most" ]] || (($(echo "$ns > $most" | bc))); then most=$ns; fi
  done
  # The issue's test of linearity: the largest time per action over the smallest.
  echo "$line  (largest / smallest $(printf "%.2f" "$(echo "$most / $least" | bc -l)")x)"
done
