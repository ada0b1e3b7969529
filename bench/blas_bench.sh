#!/usr/bin/env bash
# The BLAS kernels pptrain chooses for this CPU (pptrain/common/blas_kernels.h), side by side in one
# run: the same `--pp 1` training with no settings at all (pptrain's choice), on a CPU OpenBLAS
# does not know (played: OpenBLAS's own choice is Prescott through the tests' stand-in,
# PPTRAIN_BLAS_TEST_DETECTED), and on fixed kernels with PPTRAIN_BLAS=system (Prescott, as on the
# issue's Xeon; Haswell), and pptrain's choice with ATen's own kernels on AVX-512
# (ATEN_CPU_CAPABILITY=avx512; LibTorch 1.13 uses its AVX2 ones unless told). Runs alternate ROUNDS
# times. Prints, per configuration, the kernels
# OpenBLAS says it loaded (OPENBLAS_VERBOSE=2), the median tokens/s (every step but each run's
# first), the ratio to Prescott's, the largest relative difference of a step's loss from
# Prescott's run, and the run header's BLAS line.
#
#   bench/blas_bench.sh [path/to/pptrain]         # default: build/tools/pptrain/pptrain
#   ROUNDS=3 STEPS=6 bench/blas_bench.sh build/tools/pptrain/pptrain
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"}
bench_start blas_bench "${1:-}"

# name:environment (on top of every BLAS setting cleared)
configs=("default:"
         "unknown-cpu:OPENBLAS_CORETYPE=Prescott PPTRAIN_BLAS_TEST_DETECTED=Prescott"
         "prescott:PPTRAIN_BLAS=system OPENBLAS_CORETYPE=Prescott"
         "haswell:PPTRAIN_BLAS=system OPENBLAS_CORETYPE=Haswell"
         "aten-avx512:ATEN_CPU_CAPABILITY=avx512")
clean=(env -u OPENBLAS_CORETYPE -u PPTRAIN_BLAS -u PPTRAIN_BLAS_CHOICE -u PPTRAIN_BLAS_TEST_DETECTED
       OPENBLAS_VERBOSE=2)

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for round in $(seq "$ROUNDS"); do
  for config in "${configs[@]}"; do
    name=${config%%:*}
    # shellcheck disable=SC2086  # the configuration's assignments and the model's flags split
    "${clean[@]}" ${config#*:} "$PPTRAIN" train $MODEL --pp 1 --schedule 1f1b --steps "$STEPS" \
      --metrics "$work/$name.$round.jsonl" >"$work/$name.$round.out" 2>"$work/$name.$round.err"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

losses() { sed -n 's/.*"loss":\([0-9.eE+-]*\).*/\1/p' "$1"; }
base=$(median_field prescott tokens_per_s)
printf "%-12s %-11s %10s %16s %16s\n" config "OpenBLAS" tokens/s "vs Prescott" "loss rel diff"
for config in "${configs[@]}"; do
  name=${config%%:*}
  tokens=$(median_field "$name" tokens_per_s)
  core=$(sed -n 's/^Core: //p' "$work/$name.1.err" | tail -n 1)
  diff=$(paste <(losses "$work/$name.1.jsonl") <(losses "$work/prescott.1.jsonl") |
         awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r}
              END {printf "%.1e", m}')
  printf "%-12s %-11s %10.0f %15.2fx %16s\n" "$name" "$core" "$tokens" \
    "$(awk -v a="$tokens" -v b="$base" 'BEGIN {print a / b}')" "$diff"
done
echo
for config in "${configs[@]}"; do
  name=${config%%:*}
  printf "%-12s %s\n" "$name" "$(grep -h '^BLAS: ' "$work/$name.1.out" || echo '(no BLAS line)')"
done
