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
# smaller microbatch costs. The prediction is printed twice: with a core per process, and with
# the host's CORES (default: nproc) shared by all processes (`pptrain schedule --cores`), which
# is what 4 processes on 2 cores get.
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
CORES=${CORES:-$(nproc)}
predict() {  # pp dp stage-layers cores -> predicted step, ms
  "$PPTRAIN" schedule --schedule 1f1b --pp "$1" --dp "$2" --microbatches $M \
    --profile "$work/profile.json" --stage-layers "$3" --cores "$4" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["makespan"])'
}
names=(pp1 pp1_m8 dp2_pp1 dp2_pp2)
flags=("--pp 1 --microbatches $M" "--pp 1 --microbatches $((2 * M))" "--pp 1 --dp 2 --microbatches $M"
  "--pp 2 --dp 2 --microbatches $M")
# A core per process, and the host's $CORES cores shared by all the processes.
dedicated=("" "" "$(predict 1 2 0-9 0)" "$(predict 2 2 0-4,5-9 0)")
shared=("" "" "$(predict 1 2 0-9 "$CORES")" "$(predict 2 2 0-4,5-9 "$CORES")")
for round in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    "$PPTRAIN" train $MODEL --batch-size $BATCH --steps "$STEPS" --quiet \
      ${flags[$i]} --metrics "$work/${names[$i]}.$round.jsonl" >/dev/null
  done
done
python3 - "$work" "$ROUNDS" "$CORES" "${names[@]}" -- "${dedicated[@]}" -- "${shared[@]}" <<'PY'
import json, statistics, sys
work, rounds, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rest = sys.argv[4:]
first = rest.index("--")
second = rest.index("--", first + 1)
names = rest[:first]
dedicated = dict(zip(names, rest[first + 1:second]))
shared = dict(zip(names, rest[second + 1:]))
def median_of(name, key):
    per_round = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl")][1:]
        per_round.append(statistics.median(s[key] for s in steps))
    return statistics.median(per_round)
tokens = {n: median_of(n, "tokens_per_s") for n in names}
step = {n: median_of(n, "step_time_s") for n in names}
def columns(p, measured):
    if not p:
        return "-", "-"
    seconds = float(p) / 1000
    return f"{seconds:.3f}", f"{measured / seconds:.2f}"
print(f"predicted: a core per process, and {cores} cores shared by all processes")
print(f"{'run':10} {'tokens/s':>9} {'vs pp1':>7} {'vs pp1 M=8':>10} {'step s':>7} "
      f"{'pred 1/proc':>11} {'meas/pred':>9} {'pred shared':>11} {'meas/pred':>9}")
for n in names:
    d, dr = columns(dedicated.get(n), step[n])
    s, sr = columns(shared.get(n), step[n])
    print(f"{n:10} {tokens[n]:9.0f} {tokens[n] / tokens['pp1']:6.2f}x {tokens[n] / tokens['pp1_m8']:9.2f}x "
          f"{step[n]:7.3f} {d:>11} {dr:>9} {s:>11} {sr:>9}")
PY
