#!/usr/bin/env bash
# A rank whose peer dies stops with one line naming that peer and status 1, never an abort:
# two `pptrain train` ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT), one killed with SIGKILL at a random moment of its steps, ROUNDS times (each rank
# in turn), and once a rank that aborts by itself (PPTRAIN_TEST_CRASH_RANK). Where the kill lands
# is not deterministic (a receive, a send being posted, an all-reduce, a message half read), so
# the test repeats it a bounded number of times (about 3 s a round); bench/peer_death.sh counts
# the outcomes over many more. On one host a dead peer's connection breaks at once, so the
# survivor must be gone within $notice_s seconds of the kill (its exit included), far under the
# 30 s communication timeout: a survivor that only noticed through the timeout fails.
#
#   bash tests/peer_death_test.sh PPTRAIN_BINARY [ROUNDS]      # default 6 rounds
#
# Every rank is in a process group of its own, killed when the test ends, failed or not.
set -uo pipefail
binary=$1
rounds=${2:-6}
notice_s=5
source "$(dirname "$0")/process_groups.sh"  # dir, groups, free_port, fail

# Messages of about 1 MB each way, so that a kill often lands in the middle of one.
args="train --model gpt --layers 4 --d-model 256 --heads 4 --seq-len 128 --batch-size 16
      --microbatches 4 --pp 2 --schedule 1f1b --steps 100000 --quiet --threads 1"

# Starts both ranks on a free port; the extra variables go to both.
start_ranks() {
  local port
  port=$(free_port)
  rm -f "$dir/metrics.jsonl"
  for rank in 0 1; do
    env "$@" RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" PPTRAIN_COMM_TIMEOUT_S=30 \
      setsid "$binary" $args --metrics "$dir/metrics.jsonl" >"$dir/$rank.out" 2>"$dir/$rank.err" &
    pid[$rank]=$!
    groups+=("$!")
  done
}

# Checks how rank $1 ended after rank $2 died: status 1 and one error line, which names rank $2.
check_survivor() {
  local survivor=$1 victim=$2 what=$3 status=0 errors
  wait "${pid[$survivor]}" || status=$?
  wait "${pid[$victim]}" 2>/dev/null
  grep -q "terminate called" "$dir/$survivor.err" && fail "$what: rank $survivor aborted"
  [ "$status" = 1 ] || fail "$what: rank $survivor exited $status (expected 1)"
  errors=$(grep -c '^pptrain: error: ' "$dir/$survivor.err")
  [ "$errors" = 1 ] || fail "$what: rank $survivor wrote $errors error lines (expected 1)"
  grep -Eq "^pptrain: error: rank $survivor: .*rank $victim\b" "$dir/$survivor.err" ||
    fail "$what: rank $survivor's error line does not name rank $victim"
}

for ((round = 0; round < rounds; round++)); do
  victim=$((round % 2))
  survivor=$((1 - victim))
  start_ranks
  for ((i = 0; i < 1200; i++)); do  # past the rendezvous and the first step
    [[ -s "$dir/metrics.jsonl" ]] && break
    sleep 0.05
  done
  [[ -s "$dir/metrics.jsonl" ]] || fail "round $round: no step within 60 s"
  sleep "$(awk -v s=$RANDOM 'BEGIN { printf "%.3f", (s % 1000) / 1000 }')"
  killed=$EPOCHREALTIME
  kill -KILL "${pid[$victim]}"
  # The survivor sees the closed connection at once; 40 s is a hang.
  timeout 40 tail --pid="${pid[$survivor]}" -s 0.05 -f /dev/null ||
    fail "round $round: rank $survivor hung"
  took=$(awk -v a="$killed" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  check_survivor "$survivor" "$victim" "round $round (rank $victim killed)"
  awk -v t="$took" -v n="$notice_s" 'BEGIN { exit !(t < n) }' ||
    fail "round $round: rank $survivor took $took s to stop after rank $victim was killed (at most $notice_s)"
  echo "round $round: rank $survivor stopped $took s after rank $victim was killed: $(grep '^pptrain: error' "$dir/$survivor.err" | cut -c1-100)"
done

start_ranks PPTRAIN_TEST_CRASH_RANK=0 PPTRAIN_TEST_CRASH_STEP=2
timeout 60 tail --pid="${pid[1]}" -f /dev/null || fail "rank 1 hung after rank 0 aborted"
check_survivor 1 0 "rank 0 aborting by itself"
echo "rank 1 after rank 0 aborted: $(grep '^pptrain: error' "$dir/1.err" | cut -c1-120)"
echo "OK"
