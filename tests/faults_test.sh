#!/usr/bin/env bash
# Real network faults on an elastic run (issue 69): three hosts h1 h2 h3, network namespaces of
# their own on a bridge (netns_cluster.sh), each runs one `pptrain train` node agent of one rank
# under `--nnodes 2:3` with the c10d rendezvous at h1, training 1f1b on --pp 3, saving every 2
# steps, with --comm-timeout 5. At step 4 one host (never h1, never node 0, whose rank 0 writes
# the metrics; h1 itself for `endpoint`) meets a fault:
#   cut:       its link to the bridge is set down: its processes live on but nobody reaches them.
#              The others' ranks stop within the timeout naming its rank, their meeting finds
#              its presence silent, names the host and goes on as 2; its own rank stops by its
#              timeout. Then the link comes back: its agent rings the doorbell and the three end
#              the run, or it is refused in one line.
#   freeze:    every process of the host is stopped (SIGSTOP). As above, except that its
#              presence still takes connections (the kernel answers for a stopped process), so
#              the two go on at the last call (--rdzv-conf last_call_timeout, 8 s here). Then
#              SIGCONT: its rank stops at once, its agent joins or is refused.
#   partition: as cut, and the link stays cut: the lone host's agent stops with one line (the
#              endpoint does not answer within its join timeout, 20 s) while the two train on.
#   endpoint:  the link of h1, the endpoint's host, is cut: the two cannot meet without the
#              endpoint and h1 alone is fewer than MIN, so all three stop with one line each and
#              nobody trains; the checkpoint left resumes to the one-process result.
#   hung:      one rank (not its agent) is stopped: the others' ranks stop within the timeout
#              naming it; its agent stops it after --stopped-timeout 8 and the three meet again.
# Every run that goes on ends with the losses of every step it trained and the parameters of the
# one-process run (1e-5 relative), no two meetings train at once (each meeting names one master,
# named by as many agents as it has nodes), and no process is left on the hosts. Each case
# prints what it measured, in seconds from the fault, and fails past its stated margin.
#
# With --launcher (cut, partition), the agents are `pptrain run` (torchrun's part) of `pptrain
# train --pp 3` ranks, which re-plan themselves for the world their launcher starts (as
# tests/elastic_test.sh --launcher).
#
#   bash tests/faults_test.sh PPTRAIN_BINARY cut|freeze|partition|endpoint|hung [--launcher]
#
# Needs root, else it fails; it exits 77 (skipped) only when the kernel lacks a feature it needs
# (network, UTS or mount namespaces, veth, bridge). Every process and namespace it starts is gone
# when it ends, also when it fails or is killed.
set -uo pipefail
binary=${1:-}
fault=${2:-}
launcher=0
[ "${3:-}" = --launcher ] && launcher=1
((launcher)) && [[ ! $fault =~ ^(cut|partition)$ ]] &&
  { echo "usage: --launcher goes with cut or partition"; exit 2; }
[ -n "$binary" ] && [ -x "$binary" ] && [[ $fault =~ ^(cut|freeze|partition|endpoint|hung)$ ]] || {
  echo "usage: bash tests/faults_test.sh PPTRAIN_BINARY cut|freeze|partition|endpoint|hung" \
    "[--launcher]"
  exit 2
}
binary=$(realpath "$binary")
[ "$(id -u)" = 0 ] || { echo "FAILED: needs root (network namespaces)"; exit 1; }
for c in ip unshare; do
  command -v "$c" >/dev/null || { echo "FAILED: no $c: run scripts/install-deps.sh"; exit 1; }
done
unset "${!SLURM_@}" "${!OMPI_@}" "${!PMI_@}" "${!TORCHELASTIC_@}" MASTER_ADDR MASTER_PORT RANK \
  WORLD_SIZE LOCAL_RANK GLOO_SOCKET_IFNAME

tests=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/process_groups.sh
source "$tests/process_groups.sh"
# shellcheck source=tests/netns_cluster.sh
source "$tests/netns_cluster.sh"
netns_cluster pptrain-faults 192.168.217 h1 h2 h3
hosts=(h1 h2 h3)

comm_timeout=5  # --comm-timeout, s
# How much later than --comm-timeout the others may name the lost rank: the heartbeat reads the
# counters once a second, the agents and this script poll, on a machine that CTest shares.
named_margin=4
# How much later than that they may name the lost host and go on: the workers' end, the meeting
# (the presence tried for half a second), the layers timed for the re-plan and the new workers.
goes_on_margin=15
last_call=8  # the freeze's two go on at the last call
# The run is paced by a pause of half a second before each save (PPTRAIN_TEST_SAVE_DELAY_MS, the
# agents' only), so that it still trains when the faulty host comes back: 60 steps, saved every
# 2, take about 15 s on 3 or 2 ranks; one process, unpaced, a second. (Not many more: --dp 2,
# which the two may go on as, sums its gradients in another order, and after 300 steps its
# parameters are 5e-5 from one process's, though every loss is within 1e-5.)
steps=60
model="--model gpt --layers 6 --d-model 16 --heads 2 --seq-len 8 --batch-size 6 --microbatches 3"
train="train $model --schedule 1f1b --steps $steps --quiet"
start one timeout 60 "$binary" $train --pp 1 --metrics "$dir/one.jsonl" --save "$dir/one"
finish one

rendezvous="--nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d
  --rdzv-endpoint ${node_addr[0]}:29400 --rdzv-id faults
  --rdzv-conf join_timeout=20,last_call_timeout=$last_call --max-restarts 2 --stopped-timeout 8"
ranks="$train --pp 3 --metrics $dir/run.jsonl --save $dir/ckpt --save-every 2
  --comm-timeout $comm_timeout"
agent="$binary $ranks $rendezvous"
((launcher)) && agent="$binary run $rendezvous $binary $ranks"
for h in "${hosts[@]}"; do
  start_host "$h" "$h" env PPTRAIN_TEST_SAVE_DELAY_MS=500 timeout 100 $agent
done

# Seconds since $1 (an $EPOCHREALTIME), to 0.1 s.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# Fails unless `seconds` <= `limit`; `what` names the figure.
at_most() { awk -v s="$1" -v l="$2" 'BEGIN { exit !(s <= l) }' || fail "$3 after $1 s (> $2 s)"; }
# Waits (at most $1 s) until the command after it succeeds; fails naming $2 otherwise.
wait_until() {
  local limit=$1 what=$2 _
  shift 2
  for _ in $(seq $((limit * 10))); do
    "$@" && return
    sleep 0.1
  done
  fail "no $what after $limit s"
}
# The hosts other than the victim.
others() { local h; for h in "${hosts[@]}"; do [ "$h" = "$victim" ] || echo "$h"; done; }
has_step() { grep -q "\"step\":$1," "$dir/run.jsonl" 2>/dev/null; }
placed() { [ "$(cat "$dir"/h?.err | grep -c "^pptrain: node [0-9] of 3 ")" = 3 ]; }
# True once every other host's agent says $1 (an extended regular expression).
others_say() {
  local h
  for h in $(others); do grep -Eq "$1" "$dir/$h.err" || return 1; done
}

# The error lines of host $1's agent (under `pptrain run`, its ranks' own pass through too).
agent_errors() {
  grep "^pptrain: error: " "$dir/$1.err" | grep -v "^pptrain: error: rank [0-9]*: "
}
# The rank process of host $1: the child of its agent, which is the child of `timeout`.
rank_of() {
  local p
  for p in $(ip netns pids "${host_ns[$1]}"); do
    [[ "$(ps -o args= -p "$p")" == "timeout 100 "* ]] && pgrep -P "$(pgrep -P "$p")"
  done
}

# The victim: a host of the first meeting other than h1 (the endpoint's) and node 0's; h1 for
# the endpoint.
wait_until 40 "step 4 of the three" eval 'placed && has_step 4'
victim=h1
for h in h3 h2; do
  [ "$fault" = endpoint ] && break
  grep -q "^pptrain: node 0 of 3 " "$dir/$h.err" || { victim=$h; break; }
done
victim_rank=$(sed -n 's/^pptrain: node [0-9] of 3 (rank \([0-9]\) of 3).*/\1/p' "$dir/$victim.err")
victim_addr=${node_addr[${victim#h} - 1]}
step=$(step_losses "$dir/run.jsonl" | tail -n 1 | cut -d' ' -f1)
survivors=$(for h in $(others); do rank_of "$h"; done)
[ "$(wc -w <<<"$survivors")" = 2 ] || fail "not one rank on each other host: $survivors"
stale=$(rank_of "$victim")
case $fault in
  cut | partition | endpoint)
    ip -n "$head_ns" link set "$victim" down || fail "cannot cut $victim's link"
    ;;
  freeze) kill -STOP $(ip netns pids "${host_ns[$victim]}") || fail "cannot stop $victim" ;;
  hung) kill -STOP "$stale" || fail "cannot stop rank $victim_rank" ;;
esac
fault_at=$EPOCHREALTIME
echo "$fault: $victim (rank $victim_rank, $victim_addr) at step $step"

# The others' ranks stop, naming the victim's: their heartbeat, or a communication without an
# answer, within the timeout. (Their agents hold a rank's error line for the line that says why
# the run restarts, after the meeting: the ranks' end is the moment they named it.)
gone() { local p; for p in "$@"; do ! kill -0 "$p" 2>/dev/null || return 1; done; }
wait_until $((comm_timeout + named_margin + 5)) "end of the other ranks" gone $survivors
named_s=$(since "$fault_at")
at_most "$named_s" $((comm_timeout + named_margin)) "the other ranks stopped"
# The victim's own rank, cut off, stops too, by its own timeout: it does not go on alone.
echo "$fault: the others' ranks stopped after $named_s s (--comm-timeout $comm_timeout +" \
  "$named_margin)"
if [ "$fault" != freeze ] && [ "$fault" != hung ]; then
  wait_until 5 "end of $victim's rank" gone "$stale"
  echo "$fault: $victim's rank stopped after $(since "$fault_at") s"
fi

if [ "$fault" = endpoint ]; then
  # Nobody trains: the two cannot reach the endpoint, the endpoint's agent is alone. Each agent
  # stops with one line, the two naming the rank they lost and the endpoint, within the join
  # timeout of their meeting; the checkpoint left continues to the one-process result.
  lines=$(wc -l <"$dir/run.jsonl")
  for h in "${hosts[@]}"; do finish "$h" 1; done
  stopped_s=$(since "$fault_at")
  at_most "$stopped_s" $((comm_timeout + named_margin + 20 + 5)) "the agents stopped"
  for h in "${hosts[@]}"; do
    errors=$(agent_errors "$h")
    [ "$(grep -c . <<<"$errors")" = 1 ] ||
      fail "$h: not one error line: $(grep "^pptrain:" "$dir/$h.err")"
    want="restart 1/2 after: .*rank $victim_rank has not answered for .*; the nodes did not meet "
    want+="again: the rendezvous endpoint ${node_addr[0]}:29400 did not answer within 20 s"
    [ "$h" = h1 ] &&
      want="the rendezvous of run 'faults' at .* has 1 of at least 2 nodes after 20 s"
    grep -q "$want" <<<"$errors" || fail "$h: '$errors' is not '$want'"
    echo "endpoint: $h stopped: $errors"
  done
  echo "endpoint: all three stopped after $stopped_s s"
  [ "$(wc -l <"$dir/run.jsonl")" = "$lines" ] || fail "a step was trained after the partition"
  start after timeout 60 "$binary" $train --pp 1 --resume "$dir/ckpt" --metrics "$dir/after.jsonl" \
    --save "$dir/after"
  finish after
  same_step_losses "$dir/one.jsonl" "$dir/after.jsonl" "$steps" "endpoint: its checkpoint resumed"
  same_parameters "$dir/one" "$dir/after" "endpoint"
  nothing_left endpoint
  echo "faults endpoint: passed in $SECONDS s"
  exit 0
fi

# The others meet again and go on: without the victim (named, its presence silent; at the last
# call when it is frozen), or with it (a hung rank's agent comes once it stopped the rank).
if [ "$fault" = hung ]; then
  goes_on="^pptrain: restart 1/2 after: .*; resuming from step"
  limit=$((comm_timeout + goes_on_margin + 8))  # the agent waits --stopped-timeout 8
elif ((launcher)); then
  goes_on="^pptrain: node [0-9] \(host $victim, $victim_addr\) is gone; going on with 2 nodes$"
  limit=$((comm_timeout + goes_on_margin))
else
  goes_on="^pptrain: (node [0-9] \(host $victim, $victim_addr\) is gone; )?2 nodes with 2 ranks: "
  goes_on+="the run goes on as --pp [12] --dp [12], stages "
  limit=$((comm_timeout + goes_on_margin))
  [ "$fault" = freeze ] && limit=$((limit + last_call))
fi
wait_until $((limit + 5)) "meeting of the others" others_say "$goes_on"
goes_on_s=$(since "$fault_at")
at_most "$goes_on_s" "$limit" "the run went on"
if [ "$fault" = cut ] || [ "$fault" = partition ]; then
  others_say "^pptrain: node [0-9] \(host $victim, $victim_addr\) is gone; " ||
    fail "the others did not name $victim gone: $(grep -h "^pptrain:" "$dir"/h?.err | sort -u)"
fi
# (A rank that hears of it from the other one, whose connection broke, names that one.)
grep -q "pptrain: .*rank $victim_rank has not answered for" \
  $(others | sed "s|^|$dir/|; s|$|.err|") ||
  fail "no rank named rank $victim_rank: $(grep -h "^pptrain: restart" "$dir"/h?.err)"
echo "$fault: the others named rank $victim_rank"
echo "$fault: the run went on after $goes_on_s s: $(grep -Eh "$goes_on" "$dir/h1.err" | tail -n 1)"
if ((launcher)); then
  replan="^pptrain: the launcher started 2 ranks, not --pp 3 x --dp 1: the run goes on as "
  wait_until 20 "re-plan of the ranks" eval 'grep -q "$replan" "$dir"/h?.err'
  echo "$fault: $(grep -h "$replan" "$dir"/h?.err | head -n 1)"
fi

# Undo the fault once they train again (the metrics, appended by each restart, grow), and let
# the run end.
lines=$(wc -l <"$dir/run.jsonl")
wait_until 30 "step of the run that went on" eval '[ "$(wc -l <"$dir/run.jsonl")" -gt "$lines" ]'
case $fault in
  cut) ip -n "$head_ns" link set "$victim" up || fail "cannot restore $victim's link" ;;
  freeze) kill -CONT $(ip netns pids "${host_ns[$victim]}") ;;
esac
undone_at=$EPOCHREALTIME
# The frozen rank, woken, finds its peers gone at once: it does not go on alone.
if [ "$fault" = freeze ]; then
  wait_until 5 "end of $victim's rank once woken" gone "$stale"
  echo "freeze: $victim's rank stopped $(since "$undone_at") s after SIGCONT"
fi
if [ "$fault" = cut ] || [ "$fault" = freeze ]; then
  wait_until 40 "ring or end of $victim's agent" eval \
    'grep -q "asked to join it" "$dir/$victim.err" || ! kill -0 "${pid[$victim]}" 2>/dev/null'
  answered_s=$(since "$undone_at")
fi
if [ "$fault" = partition ]; then
  wait_until $((comm_timeout + 20 + 10)) "end of the lone host's agent" gone "${pid[$victim]}"
  lone_s=$(since "$fault_at")
  at_most "$lone_s" $((comm_timeout + named_margin + 20 + 5)) "the lone host stopped"
fi
for h in $(others); do finish "$h"; done
[ "$fault" = hung ] && finish "$victim"
status=0
wait "${pid[$victim]}" 2>/dev/null || status=$?
case $fault in
  cut | freeze)
    # Joined through the doorbell (and ended with the others), or refused in one line.
    if grep -q "^pptrain: run 'faults' is training at .*: asked to join it" "$dir/$victim.err" &&
      [ "$status" = 0 ]; then
      echo "$fault: $victim rang the doorbell $answered_s s after it came back, and joined"
    else
      [ "$status" != 0 ] || fail "$victim ended 0 without joining the run"
      errors=$(agent_errors "$victim")
      [ "$(grep -c . <<<"$errors")" = 1 ] ||
        fail "$victim: not one error line: $(grep "^pptrain:" "$dir/$victim.err")"
      echo "$fault: $victim refused $answered_s s after it came back (exit $status): $errors"
    fi
    ;;
  partition)
    # It stopped within the join timeout (20 s) of its meeting, with one line.
    [ "$status" = 1 ] || fail "the lone host ended $status, not 1"
    errors=$(agent_errors "$victim")
    [ "$(grep -c . <<<"$errors")" = 1 ] ||
      fail "$victim: not one error line: $(grep "^pptrain:" "$dir/$victim.err")"
    want="restart 1/2 after: .*; the nodes did not meet again: the rendezvous endpoint "
    # (`pptrain run` said why it restarts before it met.)
    ((launcher)) && want=""
    want+="${node_addr[0]}:29400 did not answer within 20 s"
    grep -q "$want" <<<"$errors" || fail "$victim: '$errors' is not '$want'"
    echo "partition: the lone host stopped $lone_s s after the cut: $errors"
    ;;
esac

# No two meetings trained at once: every meeting an agent joined names a master that every node
# of it names (a meeting of its own would name one of its own).
grep -h "^pptrain: node [0-9] of [0-9] " "$dir"/h?.err |
  sed 's/.*of \([0-9]\) (.*, master \([^,]*\).*/\2 \1/' | sort | uniq -c |
  awk '$1 != $3 { print; bad = 1 } END { exit bad }' >"$dir/meetings.txt" ||
  fail "a meeting that not all its nodes joined: $(cat "$dir/meetings.txt")"
same_step_losses "$dir/one.jsonl" "$dir/run.jsonl" "$steps" "$fault: the run after the fault"
same_parameters "$dir/one" "$dir/ckpt" "$fault"
nothing_left "$fault"
echo "faults $fault: passed in $SECONDS s"
