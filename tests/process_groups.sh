# Sourced by the shell tests (and benchmarks) that start processes: a scratch folder `$dir`,
# the array `groups` of process group ids, each killed with SIGKILL when the script ends, failed
# or not, free_port, and the helpers of the tests that start ranks: fail, start, finish,
# losses, reference_run and same_losses.
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
