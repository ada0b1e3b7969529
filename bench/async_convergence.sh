#!/usr/bin/env bash
# Convergence of the asynchronous schedules against synchronous 1F1B: the char-level gpt on the
# text data, 4 stages, one seed and one learning rate for every schedule. Asynchronous results do
# not depend on timing (docs/ASYNC.md), so by default each schedule runs as its one-process
# reference, --pp 1 --stages 4 (tests/async_test.cpp proves --pp 4 gives the same numbers to
# 1e-5); PP=4 runs the pipelines themselves. Prints the final loss (the mean of the last 10
# steps) and its ratio to 1f1b's, and writes the loss curves as an SVG.
#
#   bench/async_convergence.sh [path/to/pptrain] [out.svg]
#   STEPS=300 OPTIMIZER=adamw LR=1e-3 EXTRA="--warmup-steps 50" bench/async_convergence.sh build/tools/pptrain/pptrain docs/images/async-convergence.svg
set -euo pipefail
cd "$(dirname "$0")/.."
PPTRAIN=${1:-build/tools/pptrain/pptrain}
SVG=${2:-async-convergence.svg}
STEPS=${STEPS:-300}
OPTIMIZER=${OPTIMIZER:-sgd}
LR=${LR:-0.05}
PP=${PP:-1}
EXTRA=${EXTRA:-}  # more train flags for every run, e.g. "--warmup-steps 50 --momentum 0.5"
MODEL=${MODEL:-"--model gpt --layers 4 --d-model 128 --heads 4 --seq-len 64 --batch-size 16 --microbatches 8 --data default"}
[[ -x "$PPTRAIN" ]] || { echo "async_convergence: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
command -v python3 >/dev/null || { echo "async_convergence: needs python3 to draw the curves" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

placement="--pp 1 --stages 4"
[[ $PP == 4 ]] && placement="--pp 4"
names=(1f1b pipedream vertical-sync 2bw pipemare pipemare-no-fixes)
flags=("--schedule 1f1b" "--schedule pipedream" "--schedule pipedream --vertical-sync" "--schedule 2bw"
  "--schedule pipemare" "--schedule pipemare --no-lr-reschedule --no-discrepancy-correction")
for i in "${!names[@]}"; do
  "$PPTRAIN" train $MODEL $placement ${flags[$i]} --optimizer "$OPTIMIZER" --lr "$LR" $EXTRA --steps "$STEPS" --quiet \
    --metrics "$work/${names[$i]}.jsonl" >/dev/null
done
echo "$STEPS steps, --optimizer $OPTIMIZER --lr $LR $EXTRA, $placement; $MODEL"
python3 - "$SVG" "$work" "${names[@]}" <<'PY'
import json, sys
svg_path, work, names = sys.argv[1], sys.argv[2], sys.argv[3:]
curves = {n: [json.loads(l)["loss"] for l in open(f"{work}/{n}.jsonl")] for n in names}
final = {n: sum(c[-10:]) / len(c[-10:]) for n, c in curves.items()}
print(f"{'schedule':<15}{'final loss':>12}{'/ 1f1b':>9}")
for n in names:
    print(f"{n:<15}{final[n]:>12.4f}{final[n] / final['1f1b']:>8.3f}x")
# A plain line chart: steps on x, loss on y.
W, H, L, R, T, B = 720, 420, 60, 150, 30, 40
steps = max(len(c) for c in curves.values())
lo = min(min(c) for c in curves.values())
hi = max(max(c) for c in curves.values())
x = lambda i: L + (W - L - R) * i / max(steps - 1, 1)
y = lambda v: T + (H - T - B) * (hi - v) / max(hi - lo, 1e-9)
colors = ["#222222", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18">training loss per step (4 stages, same seed and lr)</text>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
for k in range(5):
    v = lo + (hi - lo) * k / 4
    out.append(f'<text x="{L-6}" y="{y(v)+4:.1f}" text-anchor="end">{v:.2f}</text>')
    s = round((steps - 1) * k / 4)
    out.append(f'<text x="{x(s):.1f}" y="{H-B+16}" text-anchor="middle">{s + 1}</text>')
for k, n in enumerate(names):
    c = curves[n]
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(c))
    out.append(f'<polyline fill="none" stroke="{colors[k % len(colors)]}" stroke-width="1.2" points="{pts}"/>')
    out.append(f'<text x="{W-R+8}" y="{T+16*k+10}" fill="{colors[k % len(colors)]}">{n}: {final[n]:.3f}</text>')
out.append("</svg>")
open(svg_path, "w").write("\n".join(out) + "\n")
print(f"curves: {svg_path}")
PY
