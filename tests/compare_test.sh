#!/usr/bin/env bash
# pptrain compare with real training runs, two approaches for 3 steps: it writes its three
# files and each run's metrics, measures 1f1b (DAPPLE) synchronous (its losses are the --pp 1
# run's) and pipedream asynchronous.
#   tests/compare_test.sh PPTRAIN_BINARY [TRAINER]   (TRAINER: the --pptrain binary; default: the first)
set -uo pipefail
pptrain=$1
trainer=${2:-$1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

out="$work/compare"
"$pptrain" compare --pptrain "$trainer" --only 1f1b,pipedream --steps 3 --layers 4 --d-model 16 \
  --heads 2 --seq-len 16 --batch-size 16 --microbatches 4 --out "$out" >"$work/log" 2>&1 \
  || fail "compare exited $?: $(cat "$work/log")"
cat "$work/log"
for file in compare.md compare.json losses.svg runs/1f1b.jsonl runs/pipedream.jsonl runs/reference-pp1.jsonl; do
  [ -s "$out/$file" ] || fail "compare did not write $file"
done
[ "$(grep -c '^compare: \[' "$work/log")" -eq 3 ] || fail "not one progress line per run"
grep -q '^| DAPPLE | `1f1b` | sync \[Sync\] |' "$out/compare.md" \
  || fail "1f1b is not sync: $(grep DAPPLE "$out/compare.md")"
grep -q '^| PipeDream | `pipedream` | async \[Async\] |' "$out/compare.md" \
  || fail "pipedream is not async: $(grep PipeDream "$out/compare.md")"
grep -q '"schedule": "sync"' "$out/compare.json" || fail "compare.json lacks 1f1b's sync"
grep -q '"schedule": "async"' "$out/compare.json" || fail "compare.json lacks pipedream's async"
grep -q '<polyline' "$out/losses.svg" || fail "losses.svg has no line"

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "compare checks passed"
