#!/usr/bin/env bash
# pptrain from Python against pptrain's command line and against torch's own Pipe (issue 29,
# "Speed"), measured side by side in one run:
#   cli-*   `pptrain train --model gpt --pp 2` with 1f1b, zb-v (its layers' deferred weight
#           gradients; and --weight-split autograd, the split a Python module gets) and gpipe;
#   py-*    the same gpt written as a Python torch.nn module (bench/python_speed.py), the same
#           two (zb-v: four) stages and sgd, driven through pptrain.runtime under
#           `pptrain run --nproc 2 .venv/bin/python`, with 1f1b, zb-v and gpipe; and zb-v with
#           pptrain.Linear layers and weight_split="deferred" (the CLI's split, from Python);
#   *-glibc the 1f1b runs again with PPTRAIN_MALLOC=system, i.e. glibc's own malloc settings
#           instead of pptrain's (keep_freed_memory in pptrain/device/memory.h), to show what
#           those are worth on each side;
#   pipe-*  torch 1.13's torch.distributed.pipeline.sync.Pipe (GPipe) on the same module and
#           stages, batch and chunks, in one process with both partitions on "cpu" (RPC
#           initialised for a world of one), with one and with two compute threads, and
#           GLIBC_TUNABLES giving its malloc the settings pptrain's workers give theirs.
# One compute thread per worker process (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1));
# configurations alternated ROUNDS times so a noisy neighbour hurts them alike; the first WARMUP
# steps of every run excluded; medians over the other steps of every round. Prints tokens/s (as
# pptrain reports them: the slowest rank's time from the step's common start to its optimizer
# step; and as the Python program's wall clock sees each step), the CPU seconds the ranks'
# F, B, I and W took per step, and the ratios; last, what Python's calls cost per microbatch
# (bench/python_speed.py overhead).
#
#   bench/python_speed.sh [BUILD_DIR]                          # default: build
#   ROUNDS=1 STEPS=4 MODEL="--model gpt --layers 4 --d-model 64 --heads 4 --seq-len 32 \
#     --batch-size 8 --microbatches 4" bench/python_speed.sh build     # a quick smoke run
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
python="${PPTRAIN_PYTHON:-.venv/bin/python}"  # the one whose torch pptrain is built against
PPTRAIN=$build/tools/pptrain/pptrain
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
TIMEOUT_S=${TIMEOUT_S:-180}  # per run
MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"}
[[ -x "$PPTRAIN" ]] || { echo "python_speed: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
[[ -e "$build/python/pptrain/runtime.py" ]] || {
  echo "python_speed: no pptrain Python package in '$build/python'" >&2; exit 2; }
(( STEPS > WARMUP )) || {
  echo "python_speed: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 2; }

cores=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export PYTHONPATH=$build/python OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d)
echo "$MODEL" >"$work/model"
# Each run is its own process group (timeout makes one and leads it; pptrain run's workers stay
# in it), so one kill stops the run with every process it started.
running=""
stop_running() {
  [[ -n "$running" ]] || return 0
  kill -TERM -- "-$running" 2>/dev/null || kill -TERM "$running" 2>/dev/null || true
  sleep 1
  kill -KILL -- "-$running" 2>/dev/null || true
  running=""
}
trap 'stop_running; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM HUP

# run NAME COMMAND...: one run, its output in $work/NAME.log; stops the benchmark if it fails.
run() {
  local name=$1 status=0
  shift
  timeout -k 5 "$TIMEOUT_S" "$@" >"$work/$name.log" 2>&1 &
  running=$!
  wait "$running" || status=$?
  running=""
  if (( status != 0 )); then
    (( status == 124 )) && echo "python_speed: $name took over $TIMEOUT_S s" >&2
    echo "python_speed: $name failed (exit status $status):" >&2
    tail -n 20 "$work/$name.log" >&2
    exit 1
  fi
}

configs=("cli-1f1b:cli --pp 2 --schedule 1f1b"
         "py-1f1b:py 1f1b"
         "cli-zb-v:cli --pp 2 --schedule zb-v"
         "cli-zb-v-autograd:cli --pp 2 --schedule zb-v --weight-split autograd"
         "py-zb-v:py zb-v"
         "py-zb-v-deferred:py zb-v-deferred"
         "cli-gpipe:cli --pp 2 --schedule gpipe"
         "py-gpipe:py gpipe"
         "cli-1f1b-glibc:cli --pp 2 --schedule 1f1b"
         "py-1f1b-glibc:py 1f1b"
         "pipe-1thread:pipe 1"
         "pipe-2threads:pipe 2")

# keep_freed_memory()'s settings, in glibc's words.
pipe_malloc=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($cores cores)"
for round in $(seq "$ROUNDS"); do
  for config in "${configs[@]}"; do
    name=${config%%:*}
    read -r kind args <<<"${config#*:}"
    out=$work/$name.$round.jsonl
    malloc=pptrain
    [[ $name == *-glibc ]] && malloc=system
    case $kind in
      cli) PPTRAIN_MALLOC=$malloc run "$name" "$PPTRAIN" train $MODEL $args --steps "$STEPS" \
             --quiet --metrics "$out" ;;
      py) PPTRAIN_MALLOC=$malloc run "$name" "$PPTRAIN" run --nproc 2 "$python" \
            bench/python_speed.py pptrain "$args" "$out" $MODEL --steps "$STEPS" ;;
      pipe) OPENBLAS_NUM_THREADS=$args OMP_NUM_THREADS=$args GLIBC_TUNABLES=$pipe_malloc \
              run "$name" "$python" bench/python_speed.py pipe "$args" "$out" $MODEL \
              --steps "$STEPS" ;;
    esac
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ROUNDS round(s) of $STEPS steps, the first $WARMUP of each excluded; $MODEL"
echo
"$python" bench/python_speed.py summary "$work" "$WARMUP"
echo
"$python" bench/python_speed.py overhead $MODEL
