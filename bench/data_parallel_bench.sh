#!/usr/bin/env bash
# Data parallelism measured side by side in one run: tokens/s of --pp 1 against --dp 2 --pp 1
# (2 processes) and --dp 2 --pp 2 (4 processes), on gpt 8x256 with one global batch, and each
# step time against the simulator's prediction from a profile (`pptrain profile`, with its
# all-reduce measurement; `pptrain schedule --profile`). The runs alternate, ROUNDS times, and
# each figure is the median over the rounds of the median step after the first.
#
#   bench/data_parallel_bench.sh [path/to/pptrain]
#   ROUNDS=3 STEPS=8 bench/data_parallel_bench.sh build/tools/pptrain/pptrain
#
# --pp 1 runs its 4 microbatches of 8 samples; "--pp 1 M=8" runs 8 of 4, the microbatch size
# each copy of --dp 2 runs, so that the ratio against it shows what the copies add, not what a
# smaller microbatch costs. The prediction assumes a core per process: with more processes than
# cores (4 on a 2-core machine) the measured step is longer by the sharing.
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
[[ -x "$PPTRAIN" ]] || { echo "data_parallel_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
command -v python3 >/dev/null || { echo "data_parallel_bench: needs python3" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

MODEL="--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 64"
BATCH=32
M=4
"$PPTRAIN" profile $MODEL --microbatch-size $((BATCH / (2 * M))) --out "$work/profile.json" >&2
predict() {  # pp dp stage-layers -> predicted step, ms
  "$PPTRAIN" schedule --schedule 1f1b --pp "$1" --dp "$2" --microbatches $M \
    --profile "$work/profile.json" --stage-layers "$3" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["makespan"])'
}
names=(pp1 pp1_m8 dp2_pp1 dp2_pp2)
flags=("--pp 1 --microbatches $M" "--pp 1 --microbatches $((2 * M))" "--pp 1 --dp 2 --microbatches $M"
  "--pp 2 --dp 2 --microbatches $M")
predicted=("" "" "$(predict 1 2 0-9)" "$(predict 2 2 0-4,5-9)")
for round in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    "$PPTRAIN" train $MODEL --batch-size $BATCH --steps "$STEPS" --quiet \
      ${flags[$i]} --metrics "$work/${names[$i]}.$round.jsonl" >/dev/null
  done
done
python3 - "$work" "$ROUNDS" "${names[@]}" -- "${predicted[@]}" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
rest = sys.argv[3:]
names = rest[:rest.index("--")]
predicted = dict(zip(names, rest[rest.index("--") + 1:]))
def median_of(name, key):
    per_round = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl")][1:]
        per_round.append(statistics.median(s[key] for s in steps))
    return statistics.median(per_round)
tokens = {n: median_of(n, "tokens_per_s") for n in names}
step = {n: median_of(n, "step_time_s") for n in names}
print(f"{'run':10} {'tokens/s':>9} {'vs pp1':>7} {'vs pp1 M=8':>10} {'step s':>7} {'predicted s':>11} {'measured/pred':>13}")
for n in names:
    p = predicted.get(n) or ""
    pred = f"{float(p) / 1000:.3f}" if p else "-"
    ratio = f"{step[n] / (float(p) / 1000):.2f}" if p else "-"
    print(f"{n:10} {tokens[n]:9.0f} {tokens[n] / tokens['pp1']:6.2f}x {tokens[n] / tokens['pp1_m8']:9.2f}x "
          f"{step[n]:7.3f} {pred:>11} {ratio:>13}")
PY
