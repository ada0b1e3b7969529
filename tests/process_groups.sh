# Sourced by the shell tests (and benchmarks) that start processes: a scratch folder `$dir`,
# the array `groups` of process group ids, each killed with SIGKILL when the script ends, failed
# or not, free_port, and the helpers of the tests that start ranks: fail, start, finish,
# losses, reference_run, same_losses, and for runs that restart from a checkpoint step_losses,
# metrics_starts, same_step_losses and same_parameters.
#
#   source "$(dirname "$0")/process_groups.sh"
#   setsid some-command & groups+=("$!")
dir=$(mktemp -d)
groups=()
cleanup() {
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A TCP port free now (the kernel's pick).
free_port() {
  "${PPTRAIN_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Prints "FAILED: <why>" and the tail of every *.err in $dir, and ends the script. A test whose
# daemons log elsewhere defines its own after sourcing this file.
fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  exit 1
}

# Starts `name`: the command after it, in a process group of its own, in the background (so that
# a SIGTERM runs the traps at once instead of after the command), with its output in
# $dir/name.out and .err; its group id (= pid) in ${pid[name]}.
declare -A pid
start() {
  local name=$1
  shift
  setsid "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  pid[$name]=$!
  groups+=("$!")
}
# Waits for `name`; fails unless it exits with `expected` (default 0).
finish() {
  local name=$1 expected=${2:-0} status=0
  wait "${pid[$name]}" || status=$?
  [ "$status" = "$expected" ] || fail "$name exited $status (expected $expected)"
}

# The losses of a metrics file, one per line.
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
# Runs `name`, the one-process run of the command after it (120 s at most), its metrics in
# $dir/name.jsonl, and keeps its 3 losses in `reference` for same_losses.
reference_run() {
  local name=$1
  shift
  start "$name" timeout 120 "$@" --metrics "$dir/$name.jsonl"
  finish "$name"
  [ "$(losses "$dir/$name.jsonl" | wc -l)" = 3 ] ||
    fail "$name: the one-process run wrote no 3 losses"
  reference=$(losses "$dir/$name.jsonl" | tr '\n' ' ')
}
# Fails unless metrics file $1 has the 3 losses of `reference` (the one-process run's, "a b c")
# to 1e-5 relative; $2 names the run.
same_losses() {
  local got
  got=$(losses "$1" | tr '\n' ' ')
  [ "$(losses "$1" | wc -l)" = 3 ] || fail "$2: no 3 losses in $1"
  awk -v a="$got" -v b="$reference" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ")
    for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d
      s = y[i] < 0 ? -y[i] : y[i]; if (d > 1e-5 * s + 1e-12) exit 1 } }' ||
    fail "$2: losses $got differ from one process's $reference"
  echo "$2: the one-process losses"
}

# "step loss" per line of a metrics file.
step_losses() { sed -n 's/.*"step":\([0-9]*\),.*"loss":\([0-9.eE+-]*\).*/\1 \2/p' "$1"; }
# The starts of a run (its first, then each restart) in the order its metrics file holds their
# steps, one line each: "RESTART PP DP STAGE_LAYERS FIRST_STEP LAST_STEP" (from each line's
# "restart" and "layout", which `pptrain train` writes).
metrics_starts() {
  sed -n 's/.*"step":\([0-9]*\),.*"restart":\([0-9]*\),"layout":{"pp":\([0-9]*\),"dp":\([0-9]*\),"stages":[0-9]*,"stage_layers":"\([^"]*\)"}.*/\2 \3 \4 \5 \1/p' "$1" |
    awk '{ key = $1 " " $2 " " $3 " " $4 }
         key != prev { if (prev != "") print prev, first, last; prev = key; first = $5 }
         { last = $5 }
         END { if (prev != "") print prev, first, last }'
}
# Fails unless every step of metrics file $2 (a run that may have restarted from checkpoints) has
# the loss of that step in $1 (one process's, 1e-5 relative) and its last step is $3; $4 names
# the run.
same_step_losses() {
  awk 'NR == FNR { want[$1] = $2; next }
       { n++; last = $1; d = $2 - want[$1]; if (d < 0) d = -d; s = want[$1] < 0 ? -want[$1] : want[$1]
         if (!($1 in want) || d > 1e-5 * s + 1e-12) { print "step " $1 ": " $2 " against " want[$1]; bad = 1 } }
       END { if (bad || n == 0 || last != steps) { print "steps trained: " n ", the last " last; exit 1 } }' \
    steps="$3" <(step_losses "$1") <(step_losses "$2") >"$dir/compare.txt" ||
    fail "$4 is not the one-process run: $(cat "$dir/compare.txt")"
  echo "$4: the one-process losses (steps $(step_losses "$2" | head -n 1 | cut -d' ' -f1)-$3)"
}
# Fails unless the layer files of checkpoint $2 hold the parameters of checkpoint $1 (one
# process's, 1e-5; read with the .venv's torch); $3 names the run.
same_parameters() {
  "${PPTRAIN_PYTHON:-python3}" - "$1" "$2" >"$dir/params.txt" 2>&1 <<'PY' ||
import glob, os, sys
import torch
want_dir, got_dir = sys.argv[1], sys.argv[2]
files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(want_dir, "layer_*.pt")))
assert files, "no layer files in " + want_dir
for name in files:
    want = dict(torch.jit.load(os.path.join(want_dir, name)).named_parameters())
    got = dict(torch.jit.load(os.path.join(got_dir, name)).named_parameters())
    assert want.keys() == got.keys(), f"{name}: {sorted(want)} against {sorted(got)}"
    for key, w in want.items():
        torch.testing.assert_close(got[key], w, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
print(f"{len(files)} layers equal")
PY
    fail "$3: the parameters differ from one process's: $(tail -n 3 "$dir/params.txt")"
  echo "$3: the parameters of the last step are one process's ($(cat "$dir/params.txt"))"
}
