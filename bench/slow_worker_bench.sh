#!/usr/bin/env bash
# A slow worker: 2 ranks, rank 1 held to a third of a core by a cgroup (as
# tests/slow_worker_test.sh, which checks the same runs for correctness), ROUNDS rounds of
# alternating runs:
#   from the start (default): `--partition uniform` against `--partition workers`: their median
#     tokens/s and the ratio (the issue's target: workers >= 1.5x uniform), and the step time
#     `--partition workers` predicted against the one measured (target: within 10%);
#   SLOW_AT=K: rank 1 slowed once rank 0 has reported K steps, `--replan off` against `--replan
#     auto` on the uniform cut: tokens/s over the last half of the steps (target: >= 1.3x);
#   DP=2: four ranks, `--pp 2 --dp 2`, the world ranks SLOW_RANKS (default 3) together in the
#     group from the start, `--partition uniform` (equal shares of the batch) against
#     `--partition workers` (its cut and the copies' shares).
# Needs root and the CPU controller of cgroups (tests/slow_rank.sh).
#
#   bench/slow_worker_bench.sh [path/to/pptrain]     # default: build/tools/pptrain/pptrain
#   ROUNDS=1 STEPS=4 bench/slow_worker_bench.sh      # a quick run
#   SLOW_AT=10 STEPS=40 bench/slow_worker_bench.sh   # a straggler mid-run
#   DP=2 SLOW_RANKS="2 3" bench/slow_worker_bench.sh  # the second copy slowed
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source tests/slow_rank.sh
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 64 --batch-size 32 --microbatches 8"}
STEPS=${STEPS:-10}
SLOW_AT=${SLOW_AT:-0}
DP=${DP:-1}
SLOW_RANKS=${SLOW_RANKS:-$((DP == 1 ? 1 : 3))}
bench_start slow_worker_bench "${1:-}"
SHARE=${SHARE:-0.33}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  slow_cgroup_remove
  rm -rf "$work"
}
trap cleanup EXIT
slow_cgroup_make "pptrain-bench-$$" "$SHARE" || { echo "slow_worker_bench: $slow_cgroup_missing" >&2; exit 2; }

# One run of `pptrain train $MODEL $2` on 2 x DP ranks, SLOW_RANKS in the slow group (from the
# start, or rank 1 once rank 0 has reported SLOW_AT steps); rank 0's metrics go to
# $work/$1.$3.jsonl (one path for every worker: whichever plays rank 0 writes them, and after a
# move of --replan auto to another placement the other one goes on in it) and worker r's stderr
# to $work/$1.$3.err.r.
run_pair() {
  local name=$1 flags=$2 round=$3 port world=$((2 * DP))
  port=$("${PPTRAIN_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for r in $(seq 0 $((world - 1))); do
    local prefix=()
    ((SLOW_AT == 0)) && [[ " $SLOW_RANKS " == *" $r "* ]] &&
      prefix=(sh -c 'echo $$ > "$0" && exec "$@"' "$slow_cgroup_procs")
    env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "${prefix[@]}" "$PPTRAIN" train \
      $MODEL --pp 2 --dp "$DP" $flags --steps "$STEPS" --quiet \
      --metrics "$work/$name.$round.jsonl" >/dev/null 2>"$work/$name.$round.err.$r" &
    pids+=($!)
  done
  if ((SLOW_AT > 0)); then
    until [ "$(cat "$work/$name.$round.jsonl" 2>/dev/null | wc -l)" -ge "$SLOW_AT" ]; do
      kill -0 "${pids[0]}" 2>/dev/null || break
      sleep 0.05
    done
    echo "${pids[1]}" >"$slow_cgroup_procs"
  fi
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$work/$name.$round.err."*; exit 1; }; done
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
if ((SLOW_AT > 0)); then
  for round in $(seq "$ROUNDS"); do
    run_pair static "--replan off" "$round"
    run_pair replan "--replan auto" "$round"
  done
  echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -h "^pptrain: --replan auto" "$work"/replan.*.err.* ||
    echo "slow_worker_bench: --replan auto did not move the layers"  # and the figures still
  # tokens/s over the last half of the steps of every round
  last_half() { for f in "$work/$1".*.jsonl; do field "$f" tokens_per_s | tail -n $((STEPS / 2)); done | median; }
  static=$(last_half static)
  replan=$(last_half replan)
  echo "model: $MODEL, $STEPS steps x $ROUNDS rounds, rank 1 at $SHARE of a core after step $SLOW_AT"
  printf "tokens/s (median of the last %d steps)  --replan off %.0f  --replan auto %.0f  ratio %.2fx\n" \
    $((STEPS / 2)) "$static" "$replan" "$(awk -v a="$replan" -v b="$static" 'BEGIN { print a / b }')"
  exit 0
fi
for round in $(seq "$ROUNDS"); do
  run_pair uniform "--partition uniform" "$round"
  run_pair workers "--partition workers" "$round"
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "^pptrain: --partition workers" "$work"/workers.1.err.0
uniform=$(median_field uniform tokens_per_s)
workers=$(median_field workers tokens_per_s)
measured_ms=$(for f in "$work"/workers.*.jsonl; do field "$f" step_time_s; done | median |
  awk '{ printf "%.1f", $1 * 1000 }')
predicted_ms=$(sed -n 's/.*predicted step \([0-9.]*\) ms.*/\1/p' "$work"/workers.*.err.0 | median)
echo "model: $MODEL --pp 2 --dp $DP, $STEPS steps x $ROUNDS rounds, ranks $SLOW_RANKS at $SHARE of a core (together)"
printf "tokens/s (median)  uniform %.0f  workers %.0f  ratio %.2fx\n" "$uniform" "$workers" \
  "$(awk -v a="$workers" -v b="$uniform" 'BEGIN { print a / b }')"
printf "step time of workers: predicted %s ms, measured %s ms (prediction %+.1f%%)\n" \
  "$predicted_ms" "$measured_ms" "$(awk -v p="$predicted_ms" -v m="$measured_ms" 'BEGIN { print (p - m) / m * 100 }')"
