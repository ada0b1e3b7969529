#!/usr/bin/env bash
# Checks that a change of structure changed nothing a user sees: runs the same commands with two
# builds of pptrain and compares what they print and write, byte for byte, one line per output
# ("same" or "DIFFERS"), then one checksum of all of them per build.
#
#   scripts/same_outputs.sh OLD_DIR NEW_DIR [--no-train]
#
# OLD_DIR and NEW_DIR hold a `pptrain` (and `pptrain-runtime`) each, e.g. the tools/pptrain
# folders of a build of main and of the branch. Compared: the help of every subcommand; for
# every registry schedule at three sizes, `schedule --json`, the text summary, the grid, the
# CSV, the SVG and the Chrome trace; `plan` folders for the four PipeDream profiles; and (unless
# --no-train) a 2-step training run of every schedule on 2 ranks: its losses (metrics JSON lines without the timings), its checkpoint's parameter files
# byte for byte, and its optimizer files' tensors (scripts/optim_state_digest.py: their entries
# are named by addresses, which change from run to run). Exits 1 when anything differs.
set -uo pipefail
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
train=1
[ "${3:-}" = "--no-train" ] && train=0
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0

# run NAME COMMAND...: the command's stdout in $work/<build>/NAME, once per build (the command
# names the binary as $PPTRAIN, found on PATH so that both print the same name, and its output
# folder as $OUT).
run() {
  local name=$1
  shift
  for build in old new; do
    local bin=$old
    [ $build = new ] && bin=$new
    mkdir -p "$work/$build/$name.d"
    PATH=$bin:$PATH PPTRAIN=pptrain OUT=$work/$build/$name.d bash -c "$*" > "$work/$build/$name" 2>&1
  done
  if cmp -s "$work/old/$name" "$work/new/$name" && diff -r "$work/old/$name.d" "$work/new/$name.d" > /dev/null; then
    echo "same     $name"
  else
    echo "DIFFERS  $name"
    differ=1
  fi
}

run help '$PPTRAIN --help'
for sub in schedule partition plan compare train profile run; do
  run "help-$sub" "\$PPTRAIN $sub --help"
done

schedules=$("$new/pptrain" schedule --list | awk -F'|' 'NR > 2 { gsub(/[` ]/, "", $2); print $2 }')
for s in $schedules; do
  for size in "2 4" "4 8" "4 16"; do
    set -- $size
    run "schedule-$s-p$1-m$2" "\$PPTRAIN schedule --schedule $s --pp $1 --microbatches $2 --json; \
      \$PPTRAIN schedule --schedule $s --pp $1 --microbatches $2 --grid --export \$OUT/s.csv \
        --svg \$OUT/s.svg --trace \$OUT/s.json"
  done
done

for profile in alexnet gnmt resnet50 vgg16; do
  file=$(ls "$root/data/pipedream/$profile"/* | head -1)
  run "plan-$profile" "\$PPTRAIN plan --profile $file --workers 4 --memory-limit 32e9 --batch 64 --out \$OUT/plan > /dev/null && \
    cd \$OUT/plan && sha256sum \$(find . -type f | sort)"
done

if [ $train = 1 ]; then
  for s in $schedules; do
    dp=1
    [ "$s" = avgpipe ] && dp=2  # it averages the weights of two or more copies
    run "train-$s" "\$PPTRAIN train --model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 \
      --pp 2 --dp $dp --schedule $s --batch-size 8 --microbatches 4 --steps 2 --quiet \
      --save \$OUT/ckpt --metrics \$OUT/m.jsonl > /dev/null 2>&1 || echo failed; \
      [ -f \$OUT/m.jsonl ] && python3 -c 'import json, sys
for line in open(sys.argv[1]): print(json.loads(line)[\"loss\"])' \$OUT/m.jsonl; \
      rm -f \$OUT/m.jsonl; cd \$OUT/ckpt 2>/dev/null && \
      sha256sum layer_*.pt && python3 $root/scripts/optim_state_digest.py optim_*.pt; cd /; \
      rm -rf \$OUT/ckpt"
  done
fi

for build in old new; do
  echo "$build: $(cd "$work/$build" && find . -type f | sort | xargs cat | sha256sum | cut -c1-16)"
done
exit $differ
