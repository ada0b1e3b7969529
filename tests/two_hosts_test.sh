#!/usr/bin/env bash
# Two hosts: a 2-rank training whose ranks live in two network namespaces joined by a veth pair,
# each started by hand as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR = the other side's
# address), gives the same losses as the local run; and when the link is cut mid-run, both ranks
# stop with a non-zero exit and a message instead of hanging.
#
#   bash tests/two_hosts_test.sh PPTRAIN_BINARY
#
# It needs root (network namespaces); without root or without `ip netns` it exits 77, which CTest
# reports as skipped.
set -uo pipefail
binary=$1

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"

tag="pp$$"
ns0="${tag}h0" ns1="${tag}h1"
net="10.213.$(($$ % 250)).0"
addr0="${net%.0}.1" addr1="${net%.0}.2"
dir=$(mktemp -d)
cleanup() {
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; for f in "$dir"/*.err; do echo "--- $f"; cat "$f"; done; exit 1; }

ip netns add "$ns0" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$ns1" || fail "second namespace"
ip link add "${tag}a" type veth peer name "${tag}b" || fail "veth pair"
ip link set "${tag}a" netns "$ns0" && ip link set "${tag}b" netns "$ns1" || fail "move veth"
ip -n "$ns0" addr add "$addr0/24" dev "${tag}a" && ip -n "$ns1" addr add "$addr1/24" dev "${tag}b"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns0" link set "${tag}a" up && ip -n "$ns1" link set "${tag}b" up || fail "links up"

model="--model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8 --microbatches 4"
# Rank r of a 2-rank run in namespace `ns`, rank 0 (the rendezvous) at addr0, in the background.
start_rank() {
  local r=$1 ns=$2 args=$3
  ip netns exec "$ns" env RANK="$r" LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$addr0" \
    MASTER_PORT=29500 PPTRAIN_COMM_TIMEOUT_S=10 timeout 120 "$binary" train $model --pp 2 \
    $args >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
}

# 1. Same losses as the run on one host.
"$binary" train $model --pp 2 --steps 3 --quiet --metrics "$dir/local.jsonl" \
  >/dev/null 2>"$dir/local.err" || fail "the local run"
start_rank 0 "$ns0" "--steps 3 --quiet --metrics $dir/hosts.jsonl"
pid0=$!
start_rank 1 "$ns1" "--steps 3 --quiet"
pid1=$!
wait "$pid0" || fail "rank 0 across hosts exited $?"
wait "$pid1" || fail "rank 1 across hosts exited $?"
losses() { grep -o '"loss":[^,]*' "$1"; }
[ "$(losses "$dir/local.jsonl" | wc -l)" = 3 ] || fail "the local run wrote no 3 losses"
diff <(losses "$dir/local.jsonl") <(losses "$dir/hosts.jsonl") || fail "losses differ"
echo "two hosts: the same 3 losses as one host"

# 2. The link cut mid-run: both ranks stop, non-zero, with a message, well before `timeout`.
start_rank 0 "$ns0" "--steps 1000000 --quiet --metrics $dir/cut.jsonl"
pid0=$!
start_rank 1 "$ns1" "--steps 1000000 --quiet"
pid1=$!
for _ in $(seq 600); do
  [ "$(wc -l <"$dir/cut.jsonl" 2>/dev/null || echo 0)" -ge 2 ] && break
  sleep 0.1
done
[ "$(wc -l <"$dir/cut.jsonl" 2>/dev/null || echo 0)" -ge 2 ] || fail "the run never got going"
ip -n "$ns0" link set "${tag}a" down
cut_at=$SECONDS
wait "$pid0"
status0=$?
wait "$pid1"
status1=$?
took=$((SECONDS - cut_at))
for r in 0 1; do
  status_var="status$r"
  status=${!status_var}
  [ "$status" != 0 ] || fail "rank $r exited 0 after the link was cut"
  [ "$status" != 124 ] || fail "rank $r hung until timeout(1) killed it"
  grep -q "pptrain: error: " "$dir/rank$r.err" || fail "rank $r stopped without a message"
done
echo "link cut: both ranks stopped within ${took} s:"
head -n1 "$dir/rank0.err" "$dir/rank1.err"
