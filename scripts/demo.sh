#!/usr/bin/env bash
# The README's first command: installs missing Debian packages, makes the Python environment
# .venv/ with the pinned torch (requirements.txt), builds pptrain against it, and trains a small
# GPT on 4 local worker processes with the 1F1B schedule, printing one line per step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/setup-venv.sh
bash scripts/build.sh
mkdir -p out
./build/tools/pptrain/pptrain schedule --schedule 1f1b --pp 4 --microbatches 8 --grid --svg out/1f1b.svg
./build/tools/pptrain/pptrain train --model gpt --layers 8 --d-model 64 --heads 4 --seq-len 64 \
  --pp 4 --schedule 1f1b --microbatches 8 --batch-size 32 --steps 60 --lr 3e-3 --optimizer adamw \
  --metrics out/demo_metrics.jsonl --svg out/demo_timeline.svg
echo "timelines: out/1f1b.svg (predicted), out/demo_timeline.svg (measured last step)"
