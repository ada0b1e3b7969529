#!/usr/bin/env bash
# Two pptrain binaries side by side: training tokens/s of the same configurations, runs
# alternated (A B in odd rounds, B A in even ones) so that a noisy neighbour, or whatever favours
# the first or second of two runs, slows both alike. ONLY="pp1 pp2-1f1b" runs just those. Prints, per
# configuration, the median tokens/s of each binary over the steps after the first of every run,
# and B / A. For checking that a change to the train path costs no throughput.
#
#   bench/ab_bench.sh OLD_BINARY NEW_BINARY
#   ROUNDS=5 STEPS=8 bench/ab_bench.sh /tmp/old/pptrain build/tools/pptrain/pptrain
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: ab_bench.sh OLD_BINARY NEW_BINARY}
B=${2:?usage: ab_bench.sh OLD_BINARY NEW_BINARY}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"}
for binary in "$A" "$B"; do
  [[ -x "$binary" ]] || { echo "ab_bench: no pptrain binary at '$binary'" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configs=("pp1:--pp 1 --schedule 1f1b"
         "pp2-1f1b:--pp 2 --schedule 1f1b"
         "pp2-zb-h1:--pp 2 --schedule zb-h1"
         "pp2-zb-v:--pp 2 --schedule zb-v"
         "pp2-pipedream:--pp 2 --schedule pipedream")
source bench/lib.sh

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for config in "${configs[@]}"; do
    name=${config%%:*}
    [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || continue
    sides="A B"
    (( round % 2 == 0 )) && sides="B A"
    for side in $sides; do
      binary=$A
      [[ $side == B ]] && binary=$B
      "$binary" train $MODEL ${config#*:} --steps "$STEPS" --quiet \
        --metrics "$work/$name-$side.$round.jsonl" >/dev/null
    done
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-12s %14s %14s %8s\n" config "A tokens/s" "B tokens/s" "B / A"
for config in "${configs[@]}"; do
  name=${config%%:*}
  [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || continue
  a=$(median_field "$name-A" tokens_per_s)
  b=$(median_field "$name-B" tokens_per_s)
  printf "%-12s %14.0f %14.0f %8.3f\n" "$name" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN {print b / a}')"
done
