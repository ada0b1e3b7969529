#!/usr/bin/env bash
# What a small `pptrain train` costs from start to exit, for two builds side by side: the median
# wall time and the CPU time (user + system, all processes) of ROUNDS runs at --pp 1, 2 and 4 of
# a model so small that the start of the processes is most of it (the e2e tests' model), the two
# builds alternating run by run, and their ratio.
#
#   bench/launch_bench.sh OLD/pptrain NEW/pptrain [ROUNDS]      # ROUNDS: default 5
set -euo pipefail
OLD=${1:?usage: launch_bench.sh OLD/pptrain NEW/pptrain [ROUNDS]}
NEW=${2:?usage: launch_bench.sh OLD/pptrain NEW/pptrain [ROUNDS]}
ROUNDS=${3:-5}
for p in "$OLD" "$NEW"; do
  [[ -x "$p" ]] || { echo "launch_bench: no pptrain binary at '$p'" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "launch_bench: needs /usr/bin/time (Debian package time)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
MODEL="--model gpt --layers 8 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

# run NAME BINARY PP: one run, its wall and CPU seconds appended to $work/NAME.PP.{wall,cpu}.
run() {
  /usr/bin/time -f '%e %U %S' -o "$work/time" "$2" train $MODEL --schedule 1f1b --pp "$3" \
    --steps 2 --quiet >/dev/null
  read -r wall user sys <"$work/time"
  echo "$wall" >>"$work/$1.$3.wall"
  awk -v u="$user" -v s="$sys" 'BEGIN {print u + s}' >>"$work/$1.$3.cpu"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
for _ in $(seq "$ROUNDS"); do
  for pp in 1 2 4; do
    run old "$OLD" "$pp"
    run new "$NEW" "$pp"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %14s %14s %7s %14s %14s %7s\n' "" "old wall (s)" "new wall (s)" "ratio" \
  "old CPU (s)" "new CPU (s)" "ratio"
for pp in 1 2 4; do
  ow=$(median <"$work/old.$pp.wall") nw=$(median <"$work/new.$pp.wall")
  oc=$(median <"$work/old.$pp.cpu") nc=$(median <"$work/new.$pp.cpu")
  printf '%-6s %14.2f %14.2f %7.2f %14.2f %14.2f %7.2f\n' "--pp $pp" "$ow" "$nw" \
    "$(awk -v a="$ow" -v b="$nw" 'BEGIN {print a / b}')" "$oc" "$nc" \
    "$(awk -v a="$oc" -v b="$nc" 'BEGIN {print a / b}')"
done
