#!/usr/bin/env bash
# A stand-in for `pptrain train` that `pptrain compare --pptrain` runs in no time
# (tests/cli_test.sh, pptrain/compare/comparison_test.cpp, python/tests/test_plan.py): it writes
# 4 steps of metrics lines as `pptrain train --metrics` does. 1f1b's losses equal the --pp 1 run's, pipedream's do
# not; pipedream lacks weight_bytes and bytes_sent and spends 1.5x the compute; gpipe fails; and
# any other schedule is refused with the registry's "unknown schedule" error, as by a binary
# built without it, which compare reports as not built.
[ "$1" = train ] || exit 1
while [ $# -gt 0 ]; do
  case $1 in --metrics) metrics=$2; shift ;; --schedule) schedule=$2; shift ;; esac
  shift
done
case $schedule in
  1f1b | pipedream) ;;
  gpipe) echo "pptrain: error: gpipe broke" >&2; echo "more" >&2; exit 1 ;;
  *) echo "pptrain: error: unknown schedule '$schedule' (expected one of: 1f1b, pipedream, gpipe)" >&2
    exit 2 ;;
esac
: >"$metrics"
for step in 1 2 3 4; do
  if [ "$schedule" = pipedream ]; then
    echo "{\"step\":$step,\"loss\":$((10 - step)).5,\"bubble_ratio\":0.1,\"peak_activation_bytes\":[20,10],\"optimizer_state_bytes\":[5,5],\"compute_s\":[1,2]}" >>"$metrics"
  else
    echo "{\"step\":$step,\"loss\":$((10 - step)),\"bubble_ratio\":0.2,\"peak_activation_bytes\":[10,10],\"optimizer_state_bytes\":[5,5],\"compute_s\":[1,1],\"bytes_sent\":[8,8],\"weight_bytes\":[5,5]}" >>"$metrics"
  fi
done
