#!/usr/bin/env bash
# A run that loses a node goes on with the rest, and takes a node that comes (issue 48, elastic
# membership): three `pptrain train` node agents of one rank each meet in a c10d rendezvous under
# --nnodes 2:3 and train 1f1b on --pp 3, saving every 2 steps. When step 10 is in the metrics,
# the test kills one node's agent and worker (the whole node: nothing of it restarts). The two
# left meet again, find the third gone (its presence refuses), name it, re-plan the run for 2
# ranks (the simulator's faster of --pp 2 and --dp 2, job/relayout.h) and continue from the
# newest whole checkpoint. A fourth node started then rings the doorbell at the endpoint: the
# two stop their ranks, and the three meet and end the run as --pp 3 (a batch of 8 does not
# split over 3 copies).
# The last call is 600 s, so neither meeting can close by it: each must close because every node
# it waits for came or is gone. The metrics file holds every start's steps, appended, each line
# naming its restart and layout: every step of every layout has the loss of the one-process run
# (1e-5 relative), the last included; the layout of 2 ranks is the one the agents named, the
# faster of the two predictions they printed, and began after a checkpoint of the run before;
# and the parameters they end with are the one-process run's (1e-5; read with the .venv's torch).
# With --launcher, the agents are `pptrain run` (torchrun's part: the launcher, not pptrain
# train, meets the others and restarts the ranks) of `pptrain train --pp 3 ... --max-restarts
# 3`: the two left are started again in a world of 2, which the ranks re-plan for themselves
# (rank 0 naming the layout and the checkpoint it continues from), and end the run there.
#
#   bash tests/elastic_test.sh PPTRAIN_BINARY [--launcher]
#
# Every process it starts is in a process group of its own, killed when the test ends.
set -uo pipefail
binary=$1
launcher=0
[ "${2:-}" = --launcher ] && launcher=1
source "$(dirname "$0")/process_groups.sh"

steps=60
model="--model gpt --layers 6 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
train="train $model --schedule 1f1b --steps $steps --quiet"
timeout 120 "$binary" $train --pp 1 --metrics "$dir/one.jsonl" --save "$dir/one" >/dev/null \
  2>"$dir/one.err" || fail "the one-process run"
port=$(free_port)
rendezvous="--nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port
  --rdzv-id elastic --rdzv-conf join_timeout=120,last_call_timeout=600"
run_files="--metrics $dir/elastic.jsonl --save $dir/ckpt --save-every 2"
agent() {
  if ((launcher)); then
    start "$1" timeout 240 "$binary" run $rendezvous --max-restarts 3 \
      "$binary" $train --pp 3 $run_files
  else
    start "$1" timeout 240 "$binary" $train --pp 3 $run_files --max-restarts 2 $rendezvous
  fi
}
for n in 0 1 2; do agent "node$n"; done
# The node to lose: one whose rank is not 0 (rank 0 writes the metrics); its agent says so.
victim=""
for _ in $(seq 600); do
  for n in 0 1 2; do
    grep -q "^pptrain: node 2 of 3" "$dir/node$n.err" 2>/dev/null && victim=node$n
  done
  [ -n "$victim" ] && grep -q '"step":10,' "$dir/elastic.jsonl" 2>/dev/null && break
  sleep 0.1
done
[ -n "$victim" ] || fail "no agent said it was node 2 of 3"
grep -q '"step":10,' "$dir/elastic.jsonl" || fail "the 3-node run did not reach step 10"
kill -KILL -- "-${pid[$victim]}"
echo "lost $victim at step $(step_losses "$dir/elastic.jsonl" | tail -n 1 | cut -d' ' -f1)"
if ((launcher)); then
  # The launchers start the two ranks left again; the ranks re-plan for a world of 2, and rank
  # 0 names the layout and the checkpoint it goes on from.
  for n in 0 1 2; do
    [ "node$n" = "$victim" ] && continue
    wait "${pid[node$n]}" || fail "node$n exited $? after $victim was lost"
  done
  grep -h "pptrain: the launcher started" "$dir"/node*.err | grep -q \
    "^pptrain: the launcher started 2 ranks, not --pp 3 x --dp 1: the run goes on as --pp [12] --dp [12] (predicted .* ms a step; --pp [12] --dp [12]: .* ms)$" ||
    fail "no line naming the new layout: $(grep -h "pptrain:" "$dir"/node*.err | sort -u)"
  grep -hq "^pptrain: --resume auto: continuing from step [0-9]* of $dir/ckpt" "$dir"/node*.err ||
    fail "no line naming the checkpoint the restart continued: $(grep -h "pptrain:" "$dir"/node*.err | sort -u)"
  echo "launcher: $(grep -h "pptrain: the launcher started" "$dir"/node*.err | head -n 1)"
else
  # The two left go on as the simulator's faster of --pp 2 --dp 1 and --pp 1 --dp 2, naming the
  # node they lost.
  for _ in $(seq 600); do
    grep -q "2 nodes with 2 ranks: the run goes on as" "$dir"/node*.err 2>/dev/null && break
    sleep 0.1
  done
  grep -h "the run goes on as" "$dir"/node*.err | head -n 1 |
    grep -q "^pptrain: node 2 (host [^,]*, 127.0.0.1) is gone; 2 nodes with 2 ranks: the run goes on as --pp [12] --dp [12], stages .* (predicted .* ms a step; --pp [12] --dp [12]: .* ms)$" ||
    fail "no line naming the lost node and the new layout: $(grep -h "pptrain:" "$dir"/node*.err | sort -u)"
  # A node that comes once they train rings; the two stop and the three meet.
  for _ in $(seq 600); do
    [ "$(grep -c '"restart":[1-9]' "$dir/elastic.jsonl")" -ge 2 ] && break
    sleep 0.1
  done
  grep -q '"step":'"$steps"',' "$dir/elastic.jsonl" &&
    fail "the run ended before the late node came (a machine too slow for this test)"
  agent node3
  for n in 0 1 2 3; do
    [ "node$n" = "$victim" ] && continue
    wait "${pid[node$n]}" || fail "node$n exited $? after $victim was lost"
  done
  grep -q "^pptrain: run 'elastic' is training at 127.0.0.1:$port: asked to join it" \
    "$dir/node3.err" || fail "the node that came late did not ring: $(cat "$dir/node3.err")"
  grep -q "^pptrain: 3 nodes with 3 ranks: the run goes on as --pp 3 --dp 1, stages " \
    "$dir/node3.err" || fail "the node that came late did not join: $(cat "$dir/node3.err")"
  grep -q "a node asks to join the run" "$dir"/node*.err ||
    fail "no agent stopped its ranks for the node that came"
  echo "a node that came while the run trained joined it: $(cat "$dir"/node*.err |
    grep -c "goes on as --pp 3") agents went on as --pp 3"
fi
# The layout the agents (or the ranks, under the launcher) named for the 2 ranks left, and its
# predicted step times: "--pp P --dp D[, stages L] (predicted X ms a step; --pp Q --dp E: Y ms)".
named=$(grep -h "the run goes on as --pp [12] --dp [12]" "$dir"/node*.err | head -n 1)
IFS='|' read -r pp dp layers best other <<<"$(sed -n 's/.* goes on as --pp \([0-9]\) --dp \([0-9]\)\(, stages \([^ ]*\)\)\? (predicted \([0-9.]*\) ms a step; --pp [0-9] --dp [0-9]: \([0-9.]*\) ms)$/\1|\2|\4|\5|\6/p' <<<"$named")"
[ -n "$other" ] || fail "no two predictions in: $named"
awk -v best="$best" -v other="$other" 'BEGIN { exit !(best <= other) }' ||
  fail "the layout chosen is not the faster prediction: $named"
# Each start's steps, in order: --pp 3 from step 1, the layout of 2 ranks from after one of its
# checkpoints, and (without --launcher) --pp 3 again from after one of the 2 ranks' checkpoints.
metrics_starts "$dir/elastic.jsonl" >"$dir/starts.txt"
echo "starts (restart pp dp stages first last):" $(tr '\n' ';' <"$dir/starts.txt")
awk -v pp="$pp" -v dp="$dp" -v layers="$layers" -v launcher="$launcher" -v steps="$steps" '
  { n++; restart[n] = $1; p[n] = $2; d[n] = $3; l[n] = $4; first[n] = $5; last[n] = $6 }
  END {
    if (n < 2 || restart[1] != 0 || p[1] != 3 || d[1] != 1 || first[1] != 1) exit 1
    two = 0
    for (i = 2; i <= n; i++) {
      if (restart[i] <= restart[i - 1]) exit 2       # the starts in the order they ran
      if ((first[i] - 1) % 2 != 0 || first[i] - 1 > last[i - 1]) exit 3  # after a checkpoint
      if (p[i] * d[i] == 2) {
        two++
        if (p[i] != pp || d[i] != dp || (layers != "" && l[i] != layers)) exit 4
      }
    }
    if (two == 0) exit 5
    if (!launcher && (p[n] != 3 || d[n] != 1)) exit 6
    if (last[n] != steps) exit 7
  }' "$dir/starts.txt" ||
  fail "the starts' layouts (exit $?) are not the run's: $(cat "$dir/starts.txt"); named: $named"
echo "the 2 ranks trained as the layout named (--pp $pp --dp $dp), predicted $best ms against $other ms"
# Every step each layout trained (from the checkpoint it continued on) and the parameters of the
# last step's checkpoint, layer by layer, against one process's.
same_step_losses "$dir/one.jsonl" "$dir/elastic.jsonl" "$steps" "elastic: the run on the nodes left"
same_parameters "$dir/one" "$dir/ckpt" elastic
