#!/usr/bin/env bash
# The joint planner's speed: `pptrain plan` over a 64-layer profile (a GPT-like chain with a
# heavier embedding and head, written here) on 8 workers, the whole default search (every
# partition method, every synchronous schedule at up to 4 chunks, every divisor of the batch as
# M, recomputation off and on). Prints the planner's own count and search time and the wall time
# of the whole command (reading, search, writing the files), best of ROUNDS runs.
#
#   bench/plan_search_bench.sh [PPTRAIN_BINARY]     # default build-plan/tools/pptrain/pptrain
#   LAYERS=64 WORKERS=8 BATCH=256 LIMIT=4e9 ROUNDS=3 bench/plan_search_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pptrain=${1:-build-plan/tools/pptrain/pptrain}
LAYERS=${LAYERS:-64}
WORKERS=${WORKERS:-8}
BATCH=${BATCH:-256}
LIMIT=${LIMIT:-4e9}
ROUNDS=${ROUNDS:-3}
[[ -x "$pptrain" ]] || { echo "plan_search_bench: no pptrain binary at '$pptrain'" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Layer 0 embeds (large parameters, cheap), the last is the head (large parameters and time),
# the blocks between alternate slightly in cost. Figures for one sample.
awk -v layers="$LAYERS" 'BEGIN {
  printf "{\"format\": \"pptrain-profile-1\", \"settings\": {\"microbatch_size\": 1}, \"layers\": [\n"
  for (l = 0; l < layers; l++) {
    f = 1.0 + 0.25 * (l % 3); params = 12e6; stash = 40e6
    if (l == 0) { f = 0.2; params = 100e6; stash = 4e6 }
    if (l == layers - 1) { f = 3.0; params = 100e6; stash = 60e6 }
    printf "  {\"name\": \"layer%d\", \"forward_ms\": %g, \"backward_input_ms\": %g, ", l, f, 1.1 * f
    printf "\"backward_weight_ms\": %g, \"activation_bytes\": 4e6, \"stash_bytes\": %g, ", 0.9 * f, stash
    printf "\"parameter_bytes\": %g}%s\n", params, (l + 1 < layers ? "," : "")
  }
  printf "]}\n"
}' >"$work/profile.json"

best=""
for _ in $(seq "$ROUNDS"); do
  start=$(date +%s.%N)
  "$pptrain" plan --profile "$work/profile.json" --workers "$WORKERS" --memory-limit "$LIMIT" \
    --batch "$BATCH" --out "$work/out" >"$work/table"
  end=$(date +%s.%N)
  wall=$(echo "$end - $start" | bc)
  if [[ -z "$best" ]] || (($(echo "$wall < $best" | bc))); then best=$wall; fi
done
grep -m1 "candidates evaluated" "$work/table"
grep -m1 "  partition" "$work/table"
grep -m1 -E "^ +1 " "$work/table"
printf "wall time of pptrain plan, best of %d: %.2f s (%d layers x %d workers, batch %d)\n" \
  "$ROUNDS" "$best" "$LAYERS" "$WORKERS" "$BATCH"
