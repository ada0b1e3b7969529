# Shared by the training benchmarks (sourced): the alternating runs and reading their metrics.
# The caller sets PPTRAIN, MODEL, ROUNDS, STEPS, work (a scratch folder) and
# configs=("name:flags" ...).

# The common start of the gpt benchmarks: `bench_start NAME [PPTRAIN]` sets PPTRAIN (default the
# build's), ROUNDS, STEPS and MODEL (from the environment, else the defaults of zb_bench.sh),
# checks them, and makes the scratch folder `work`, removed on exit.
bench_start() {
  PPTRAIN=${2:-build/tools/pptrain/pptrain}
  ROUNDS=${ROUNDS:-3}
  STEPS=${STEPS:-6}
  MODEL=${MODEL:-"--model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --microbatches 8"}
  [[ -x "$PPTRAIN" ]] || { echo "$1: no pptrain binary at '$PPTRAIN'" >&2; exit 2; }
  (( STEPS >= 2 )) || { echo "$1: STEPS must be >= 2 (the first step is a warm-up), got $STEPS" >&2; exit 2; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}

# The values of one numeric field of a metrics file, skipping the first (warm-up) step.
field() { sed -n "s/.*\"$2\":\([0-9.eE+-]*\).*/\1/p" "$1" | tail -n +2; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
# The median of a field over every step (but the first) of every round of one configuration.
median_field() { for f in "$work/$1".*.jsonl; do field "$f" "$2"; done | median; }

# Runs every configuration once per round, alternating, so a noisy neighbour hurts them alike;
# round r of configuration NAME writes $work/NAME.r.jsonl.
run_rounds() {
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)   ($(nproc) cores)"
  for round in $(seq "$ROUNDS"); do
    for config in "${configs[@]}"; do
      local name=${config%%:*}
      "$PPTRAIN" train $MODEL ${config#*:} --steps "$STEPS" --quiet --metrics "$work/$name.$round.jsonl" >/dev/null
    done
  done
  echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
}
