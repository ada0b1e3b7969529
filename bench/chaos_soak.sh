#!/usr/bin/env bash
# The chaos soak at full length (tests/soak_test.cpp runs it short in the tests): gpt on 4
# ranks, 200 steps with --save-every 10 --max-restarts 10, hit by kill -9 at 5 moments drawn
# from each of 3 seeds (a worker, or the launcher itself, which is then started again with
# --resume auto; some during saves), for 1f1b, zb-v and pipedream: the final parameters must equal
# the uninterrupted run's to 1e-6, with one restart per kill and no process left. Then the leak
# check: 2,000 steps with --save-every 50 --keep 3, at most 3 checkpoints on disk, each rank's
# resident memory after the last step within 5% of its value after step 100 (both printed).
#
#   bench/chaos_soak.sh [build folder]      # default: build
#   SEEDS=1 STEPS=60 bench/chaos_soak.sh    # shorter
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
binary="$build/tests/soak_test"
[[ -x "$binary" ]] || { echo "chaos_soak: no test binary at '$binary' (build first)" >&2; exit 2; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
start=$SECONDS
PPTRAIN_SOAK_STEPS=${STEPS:-200} PPTRAIN_SOAK_SEEDS=${SEEDS:-3} PPTRAIN_SOAK_KILLS=${KILLS:-5} \
PPTRAIN_SOAK_SCHEDULES=${SCHEDULES:-"1f1b zb-v pipedream"} \
PPTRAIN_SOAK_LONG_STEPS=${LONG_STEPS:-2000} PPTRAIN_SOAK_LONG_SAVE_EVERY=${LONG_SAVE_EVERY:-50} \
  "$binary" --gtest_brief=1
echo "took $((SECONDS - start)) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
