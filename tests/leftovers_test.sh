#!/usr/bin/env bash
# Nothing of a run outlives it (issue 69, item 5): after each way a run of `pptrain train --pp 2`
# can end, no process of it is left, no shared-memory ring or /dev/shm folder of pptrain's is
# left beside those there before, and its store's port is closed:
#   a) a normal run over shared memory (PPTRAIN_SHM=1, the rings);
#   b) a worker killed with SIGKILL mid-run (the launcher stops the other, exits 1);
#   c) the launcher killed with SIGKILL mid-run (its workers die with it: PR_SET_PDEATHSIG);
#   d) the whole process group killed with SIGKILL;
#   e) a failed start: bad input (exit 2, nothing started), and a rank of two started by hand
#      whose peer never comes (exit 1 after its communication timeout).
# Every process the run starts has the scratch folder in its command line (its --metrics path),
# which is how the test finds them.
#
#   bash tests/leftovers_test.sh PPTRAIN_BINARY
set -uo pipefail
binary=$1
source "$(dirname "$0")/process_groups.sh"  # dir, groups, free_port, fail, start

args="train --model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8
      --microbatches 4 --schedule 1f1b --pp 2 --quiet"
shm_entries() { ls -A /dev/shm 2>/dev/null | grep '^pptrain' | sort; }
before=$(shm_entries)

# The processes still running whose command line names the scratch folder (not this shell's).
run_processes() {
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = $$ ] && continue
    { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "$dir/" && echo "${p#/proc/}"
  done
}

# check_clean CASE [PORT]: within 10 s no process of the run is left; no pptrain entry of
# /dev/shm is new; PORT (a store's) is not listened on.
check_clean() {
  local what=$1 port=${2:-} left=""
  for _ in $(seq 100); do
    left=$(run_processes)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || fail "$what: processes left: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
  local new
  new=$(comm -13 <(echo "$before") <(shm_entries))
  [ -z "$new" ] || fail "$what: left in /dev/shm: $new"
  if [ -n "$port" ] && ss -ltn 2>/dev/null | grep -q ":$port\b"; then
    fail "$what: port $port is still listened on"
  fi
  echo "$what: nothing left"
}

# Waits until the run's metrics file has a step (the workers are past their start).
wait_for_steps() {
  for _ in $(seq 600); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  fail "no step in $1 within 60 s"
}

# a) A normal run, its ranks linked by rings in shared memory.
PPTRAIN_SHM=1 timeout 120 "$binary" $args --steps 3 --metrics "$dir/a.jsonl" --save "$dir/a" \
  >"$dir/a.out" 2>"$dir/a.err" || fail "a) the run failed"
grep -q '"links":{"0-1":"shm"}' "$dir/a.jsonl" || fail "a) the ranks did not link through shm"
check_clean "a) a normal run"

# b) One worker killed: the launcher names it and stops the other.
start b env PPTRAIN_SHM=1 timeout 120 "$binary" $args --steps 100000 --metrics "$dir/b.jsonl"
wait_for_steps "$dir/b.jsonl"
launcher=$(pgrep -P "${pid[b]}" -f "$dir/b.jsonl" | head -n 1)  # timeout's child
worker=$(pgrep -P "$launcher" | head -n 1)
[ -n "$worker" ] || fail "b) no worker of the launcher $launcher"
kill -KILL "$worker"
wait "${pid[b]}"
status=$?
[ "$status" = 1 ] || fail "b) the launcher exited $status after its worker was killed (expected 1)"
check_clean "b) a worker killed"

# c) The launcher killed: its workers follow it.
start c env PPTRAIN_SHM=1 "$binary" $args --steps 100000 --metrics "$dir/c.jsonl"
wait_for_steps "$dir/c.jsonl"
kill -KILL "${pid[c]}"
wait "${pid[c]}" 2>/dev/null
check_clean "c) the launcher killed"

# d) The whole group killed.
start d env PPTRAIN_SHM=1 "$binary" $args --steps 100000 --metrics "$dir/d.jsonl"
wait_for_steps "$dir/d.jsonl"
kill -KILL -- "-${pid[d]}"
wait "${pid[d]}" 2>/dev/null
check_clean "d) the group killed"

# e) Bad input, then a rank whose peer never comes.
timeout 60 "$binary" $args --steps 3 --precision fp8 --metrics "$dir/e.jsonl" \
  >"$dir/e1.out" 2>"$dir/e1.err"
status=$?
[ "$status" = 2 ] || fail "e) bad input exited $status (expected 2)"
check_clean "e) bad input"
port=$(free_port)
env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  PPTRAIN_COMM_TIMEOUT_S=3 timeout 60 "$binary" $args --steps 3 --metrics "$dir/e.jsonl" \
  >"$dir/e2.out" 2>"$dir/e2.err"
status=$?
[ "$status" = 1 ] || fail "e) a rank whose peer never came exited $status (expected 1)"
check_clean "e) a rank whose peer never came" "$port"
echo "OK"
