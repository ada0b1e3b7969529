#!/usr/bin/env bash
# Start-up cost of the planner CLI: the median wall time of RUNS runs and the peak resident set
# (/usr/bin/time -v, "Maximum resident set size", largest over the runs) of two commands that
# never train: `--help` and a small `schedule`.
#
#   bench/startup_bench.sh [path/to/pptrain] [RUNS]     # defaults: build/tools/pptrain/pptrain, 5
set -euo pipefail
PPTRAIN=${1:-build/tools/pptrain/pptrain}
RUNS=${2:-5}
[[ -x "$PPTRAIN" ]] || { echo "startup_bench: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "startup_bench: needs /usr/bin/time (Debian package time)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

# measure ARGS...: one line with the median wall time (s) and the peak RSS (MB) of `pptrain ARGS`.
measure() {
  local walls=() rss_kb=0 start end kb
  for _ in $(seq "$RUNS"); do
    start=$EPOCHREALTIME
    /usr/bin/time -v -o "$work/time" "$PPTRAIN" "$@" >/dev/null
    end=$EPOCHREALTIME
    walls+=("$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')")
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time")
    ((kb > rss_kb)) && rss_kb=$kb
  done
  printf '%-55s %7.3f s  %6.1f MB\n' "pptrain $*" "$(printf '%s\n' "${walls[@]}" | median)" \
    "$(awk -v k="$rss_kb" 'BEGIN {print k / 1024}')"
}

echo "$PPTRAIN: median wall time of $RUNS runs, peak RSS; load average $(cut -d' ' -f1-3 /proc/loadavg)"
measure --help
measure schedule --schedule 1f1b --pp 4 --microbatches 8
