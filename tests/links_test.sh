#!/usr/bin/env bash
# Which link each pair of ranks used (issue 69, item 3), and the shared-memory fallbacks, on
# `pptrain train --pp 2` of two ranks of this host. Each case checks the start line ("links: shm
# between ranks 0-1"), the metrics' "links" field, and that the losses are the one-process
# run's (1e-5 relative):
#   a) both ranks allow shared memory:       shm
#   b) PPTRAIN_SHM=0 on both:                gloo
#   c) PPTRAIN_SHM=0 on rank 1 only:         gloo on both ends (ranks started by hand)
#   d) a /dev/shm too small for the rings (a 64 KiB tmpfs over it, in a mount namespace of the
#      two ranks'; needs root, else this case is skipped with a line): gloo
#
#   bash tests/links_test.sh PPTRAIN_BINARY
set -uo pipefail
binary=$1
source "$(dirname "$0")/process_groups.sh"  # dir, groups, free_port, fail, start, same_losses
unset "${!SLURM_@}" "${!OMPI_@}" "${!PMI_@}" MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK

train="train --model gpt --layers 4 --d-model 32 --heads 4 --seq-len 16 --batch-size 8
       --microbatches 4 --schedule 1f1b --steps 3"
reference_run one "$binary" $train --pp 1 --quiet

# check NAME LINK: the run NAME's start line and every metrics line name LINK for ranks 0-1.
check() {
  local name=$1 link=$2
  grep -q "^links: $link between ranks 0-1\$" "$dir/$name.out" ||
    fail "$name: no start line 'links: $link between ranks 0-1' in: $(grep links "$dir/$name.out")"
  [ "$(grep -c "\"links\":{\"0-1\":\"$link\"}" "$dir/$name.jsonl")" = 3 ] ||
    fail "$name: the metrics do not say \"0-1\":\"$link\" on each of their 3 lines"
  same_losses "$dir/$name.jsonl" "$name ($link)"
}

# launched NAME [ENV...]: both ranks under `pptrain run`, with ENV set for both.
launched() {
  local name=$1
  shift
  start "$name" env "$@" timeout 120 "$binary" run --nproc-per-node 2 --master-port "$(free_port)" \
    "$binary" $train --pp 2 --metrics "$dir/$name.jsonl"
  finish "$name"
}
launched a PPTRAIN_SHM=1
check a shm
launched b PPTRAIN_SHM=0
check b gloo

# c) The ranks by hand, as torchrun would start them, rank 1 without shared memory.
port=$(free_port)
for rank in 0 1; do
  start "c$rank" env RANK="$rank" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    PPTRAIN_SHM=$((rank == 0)) timeout 120 "$binary" $train --pp 2 --metrics "$dir/c$rank.jsonl"
done
finish c0
finish c1
check c0 gloo

# d) /dev/shm of 64 KiB: the rings (4 MiB each) have no room, so the pair takes Gloo.
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  start d unshare -m bash -c "mount -t tmpfs -o size=64k tmpfs /dev/shm &&
    PPTRAIN_SHM=1 timeout 120 '$binary' run --nproc-per-node 2 --master-port $(free_port) \
      '$binary' $(echo $train) --pp 2 --metrics '$dir/d.jsonl'"
  finish d
  check d gloo
else
  echo "d: skipped (a mount namespace needs root)"
fi
echo "PASSED"
