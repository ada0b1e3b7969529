#!/usr/bin/env bash
# One pptrain command run by two binaries in turn (old, new, old, new, ...), so that a noisy
# neighbour slows both alike; prints each binary's median wall time and new / old. For planner
# commands, which take milliseconds (bench/ab_bench.sh compares training throughput).
#
#   bench/ab_command.sh OLD_BINARY NEW_BINARY ROUNDS -- ARGS...
#   bench/ab_command.sh /tmp/old/pptrain build/tools/pptrain/pptrain 25 -- \
#     schedule --schedule zb-v --pp 64 --microbatches 512 --json
set -euo pipefail
old=${1:?usage: ab_command.sh OLD_BINARY NEW_BINARY ROUNDS -- ARGS...}
new=${2:?usage: ab_command.sh OLD_BINARY NEW_BINARY ROUNDS -- ARGS...}
rounds=${3:?usage: ab_command.sh OLD_BINARY NEW_BINARY ROUNDS -- ARGS...}
[[ "${4:-}" == "--" ]] || { echo "ab_command: expected -- before the command's arguments" >&2; exit 2; }
shift 4
for binary in "$old" "$new"; do
  [[ -x "$binary" ]] || { echo "ab_command: no pptrain binary at '$binary'" >&2; exit 2; }
done
times=$(mktemp)
trap 'rm -f "$times"' EXIT
for _ in $(seq "$rounds"); do
  for which in old new; do
    binary=${!which}
    start=$EPOCHREALTIME
    "$binary" "$@" >/dev/null 2>&1 || { echo "ab_command: $binary $* failed" >&2; exit 1; }
    end=$EPOCHREALTIME
    awk -v w="$which" -v a="$start" -v b="$end" 'BEGIN {printf "%s %.3f\n", w, (b - a) * 1000}' >>"$times"
  done
done
median() { grep "^$1 " "$times" | awk '{print $2}' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
old_ms=$(median old)
new_ms=$(median new)
printf "old %8.1f ms\nnew %8.1f ms   (median of %d runs each)\nnew / old %.3f\n" \
  "$old_ms" "$new_ms" "$rounds" "$(awk -v a="$old_ms" -v b="$new_ms" 'BEGIN {print b / a}')"
