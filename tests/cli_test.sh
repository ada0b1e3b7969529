#!/usr/bin/env bash
# CLI checks that need no LibTorch: pictures that rsvg-convert renders, the --json fields other
# tools rely on, and one-line errors with exit status 2 for bad input.
#   tests/cli_test.sh PPTRAIN_BINARY [RSVG_CONVERT]
set -uo pipefail
pptrain=$1
rsvg=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error "description" "substring of the message" command...
# The message is one line; an invalid schedule may follow it with the marked grid, a picture whose
# every line starts with "rank ".
expect_error() {
  local what=$1 needle=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [ "$code" -ne 2 ]; then fail "$what: exit $code, expected 2"; return; fi
  if [ "$(grep -vc '^rank ' "$work/err")" -ne 1 ]; then fail "$what: error is not one line:"; cat "$work/err"; return; fi
  head -1 "$work/err" | grep -q -- "$needle" || fail "$what: message lacks '$needle': $(cat "$work/err")"
}

# The README's table of schedules is the registry's (pptrain schedule --list).
readme="$(dirname "$0")/../README.md"
"$pptrain" schedule --list >"$work/list" || fail "schedule --list exited $?"
grep -qF -- "$(head -3 "$work/list")" "$readme" || fail "schedule --list printed nothing usable"
while IFS= read -r line; do
  grep -qxF -- "$line" "$readme" || fail "README's schedule table lacks: $line (paste pptrain schedule --list)"
done <"$work/list"
[ "$(grep -c '^| `' "$readme")" -eq "$(grep -c '^| `' "$work/list")" ] \
  || fail "README's schedule table has rows the registry does not (paste pptrain schedule --list)"

# The schedule picture renders.
for name in gpipe 1f1b zb-h2 zb-v; do
  "$pptrain" schedule --schedule "$name" --pp 4 --microbatches 8 --svg "$work/$name.svg" >/dev/null \
    || fail "schedule $name --svg exited $?"
  if [ -n "$rsvg" ]; then
    "$rsvg" -o "$work/$name.png" "$work/$name.svg" || fail "rsvg-convert could not render $name.svg"
  fi
done

# --json carries every field of the interface.
json=$("$pptrain" schedule --schedule 1f1b --pp 4 --microbatches 8 --json)
for field in schedule pp chunks microbatches dp makespan bubble_ratio ranks rank busy idle peak_activations \
  weight_versions peak_memory; do
  grep -q "\"$field\"" <<<"$json" || fail "schedule --json lacks \"$field\": $json"
done
grep -q '"bubble_ratio":0.2727' <<<"$json" || fail "1f1b P=4 M=8 bubble is not 3/11: $json"
# Without weights in the cost model, peak memory is the activations and the table has no column.
grep -q '"peak_activations":4.0,"peak_memory":4.0,"weight_versions":1}' <<<"$json" \
  || fail "1f1b without weights: peak_memory is not peak_activations: $json"
"$pptrain" schedule --schedule 1f1b --pp 4 --microbatches 8 | grep -q "peak memory" \
  && fail "schedule shows a peak memory column without weights in the cost model"

# Export, then import what was exported: same simulation.
"$pptrain" schedule --schedule zb-h1 --pp 3 --microbatches 6 --export "$work/zb.csv" --with-comms --json >"$work/a.json"
"$pptrain" schedule --import "$work/zb.csv" --json >"$work/b.json"
sed 's/"schedule":"[^"]*",//' "$work/a.json" >"$work/a2.json"
sed 's/"schedule":"[^"]*",//' "$work/b.json" >"$work/b2.json"
cmp -s "$work/a2.json" "$work/b2.json" || fail "export/import changed the simulation: $(cat "$work/a.json") vs $(cat "$work/b.json")"

# Skip connections: exported with their messages, imported back with the same skips and figures;
# a file whose skip send lost its receive is refused naming the rank and action.
"$pptrain" schedule --schedule 1f1b --pp 4 --microbatches 4 --skip 0:3 --skip 1:3 \
  --cost F=1,I=1,W=1,comm=0.5,skip=2 --export "$work/skip.csv" --with-comms --json >"$work/a.json"
grep -q '"skips":\[\[0,3\],\[1,3\]\]' "$work/a.json" || fail "no skips in the summary: $(cat "$work/a.json")"
grep -q '0SEND_F2>3' "$work/skip.csv" || fail "no skip message in the export: $(cat "$work/skip.csv")"
"$pptrain" schedule --import "$work/skip.csv" --cost F=1,I=1,W=1,comm=0.5,skip=2 --json >"$work/b.json"
sed 's/"schedule":"[^"]*",//' "$work/a.json" >"$work/a2.json"
sed 's/"schedule":"[^"]*",//' "$work/b.json" >"$work/b2.json"
cmp -s "$work/a2.json" "$work/b2.json" || fail "skips: export/import changed the simulation: $(cat "$work/a.json") vs $(cat "$work/b.json")"
sed 's/,3RECV_F1<0//' "$work/skip.csv" >"$work/skip_no_recv.csv"
expect_error "skip send without its receive" "rank 3, position 10 (3F1): forward of stage 3 microbatch 1 needs 3RECV_F1<0" \
  "$pptrain" schedule --import "$work/skip_no_recv.csv"
expect_error "skip to the next stage" "a skip from stage 0 to stage 1 in 4 stages" \
  "$pptrain" schedule --schedule 1f1b --pp 4 --microbatches 2 --skip 0:1
expect_error "skip text" "--skip must be FROM:TO" "$pptrain" schedule --schedule 1f1b --pp 4 --microbatches 2 --skip 0-3
expect_error "skip with import" "--skip does not apply to --import" \
  "$pptrain" schedule --import "$work/skip.csv" --skip 0:3

# torch.distributed.pipelining's ScheduleDualPipeV order, as its CSV writer prints it
# (data/torch/README.md), is pptrain's dualpipev action for action.
for csv in "$(dirname "$0")"/../data/torch/dualpipev_p*_m*.csv; do
  size=$(basename "$csv" .csv)
  pp=$(sed 's/.*_p\([0-9]*\)_m.*/\1/' <<<"$size")
  mb=$(sed 's/.*_m\([0-9]*\)$/\1/' <<<"$size")
  "$pptrain" schedule --import "$csv" --export "$work/imported.csv" >/dev/null \
    || fail "torch's $size does not import"
  "$pptrain" schedule --schedule dualpipev --pp "$pp" --microbatches "$mb" \
    --export "$work/ours.csv" >/dev/null || fail "dualpipev --pp $pp --microbatches $mb failed"
  cmp -s "$work/imported.csv" "$work/ours.csv" || fail "torch's $size is not pptrain's dualpipev"
  cmp -s "$csv" "$work/ours.csv" || fail "pptrain's dualpipev is not written as torch's $size"
done

# Bad input.
# An asynchronous schedule: --steps mini-batches in one run, no flush, and each rank's versions.
json=$("$pptrain" schedule --schedule pipedream --pp 4 --microbatches 8 --steps 3 --json)
grep -q '"microbatches":24' <<<"$json" || fail "pipedream --steps 3 is not one run of 24 microbatches: $json"
grep -q '"weight_update":"pipedream"' <<<"$json" || fail "schedule --json lacks the weight update: $json"
grep -q '"weight_versions":4}.*"weight_versions":3}.*"weight_versions":2}.*"weight_versions":1}' <<<"$json" \
  || fail "pipedream on 4 ranks does not keep 4,3,2,1 versions: $json"
# weights= counts each version: pipedream's rank r holds 4-r activations and 4-r versions of 2.
json=$("$pptrain" schedule --schedule pipedream --pp 4 --microbatches 8 --cost F=1,I=1,W=1,comm=0,weights=2 --json)
grep -q '"peak_memory":12.0,.*"peak_memory":9.0,.*"peak_memory":6.0,.*"peak_memory":3.0,' <<<"$json" \
  || fail "pipedream on 4 ranks with weights=2 does not peak at 12,9,6,3: $json"
"$pptrain" schedule --schedule pipedream --pp 4 --microbatches 8 --cost weights=2 | grep -q "peak memory" \
  || fail "schedule with weights= lacks the peak memory column"
expect_error "negative weights" "value of weights must be a finite number >= 0, got '-1'" \
  "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 2 --cost F=1,weights=-1
json=$("$pptrain" schedule --schedule pipedream --vertical-sync --pp 4 --microbatches 8 --json)
[[ $(grep -o '"weight_versions":4' <<<"$json" | wc -l) == 4 ]] \
  || fail "vertical sync on 4 ranks does not keep 4 versions everywhere: $json"
expect_error "vertical sync on 1f1b" "--vertical-sync applies to --schedule pipedream only" \
  "$pptrain" schedule --schedule 1f1b --vertical-sync --pp 2 --microbatches 2
expect_error "2bw with too few microbatches" "needs --microbatches >= 3" \
  "$pptrain" schedule --schedule 2bw --pp 4 --microbatches 2

# --dp D: each stage all-reduces its gradients after its last backward, beside the cool-down.
# 1f1b on 2 ranks, 4 microbatches: the compute ends at 15, rank 0's all-reduce (reduce=3) at 18.
json=$("$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 4 --cost F=1,I=1,W=1,reduce=3 --dp 2 --json)
grep -q '"dp":2,"makespan":18.0,' <<<"$json" || fail "1f1b --dp 2 reduce=3 does not end at 18: $json"
"$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 4 --cost reduce=3 --json | grep -q '"dp":1,"makespan":15.0,' \
  || fail "reduce= without --dp changes the makespan"
"$pptrain" schedule --schedule zb-v --pp 2 --microbatches 4 --dp 2 --grid | grep -q '^rank 1 |.* 2REDUCE_GRAD .* 1REDUCE_GRAD$' \
  || fail "zb-v --dp 2 --grid lacks rank 1's two reductions"
"$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 4 --dp 2 --trace "$work/dp.json" --svg "$work/dp.svg" >/dev/null \
  || fail "schedule --dp 2 --trace --svg exited $?"
grep -q '"rank 1 all-reduce"' "$work/dp.json" || fail "--dp trace lacks the all-reduce track"
grep -q 'class="reduce"' "$work/dp.svg" || fail "--dp picture lacks the all-reduce bars"
if [ -n "$rsvg" ]; then "$rsvg" -o "$work/dp.png" "$work/dp.svg" || fail "rsvg-convert cannot render the --dp picture"; fi
"$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 4 --dp 2 --export "$work/dp.csv" >/dev/null
grep -q ',1REDUCE_GRAD$' "$work/dp.csv" || fail "--dp --export lacks the reductions: $(cat "$work/dp.csv")"
"$pptrain" schedule --import "$work/dp.csv" --dp 2 --json | grep -q '"dp":2' || fail "a reduced schedule does not import"
expect_error "zero replicas" "--dp must be >= 1" "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 2 --dp 0
expect_error "dp of an asynchronous schedule" "--dp 2 needs a synchronous schedule" \
  "$pptrain" schedule --schedule pipedream --pp 2 --microbatches 2 --dp 2
printf '0F0,0F1,0B0,0REDUCE_GRAD,0B1\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n' >"$work/early.csv"
expect_error "reduction before its backward" "0REDUCE_GRAD runs before 0B1" \
  "$pptrain" schedule --import "$work/early.csv"

# Limits, checked before any memory is spent (each used to take gigabytes or run unbounded).
expect_error "too many ranks" "--pp 5000000 is more than the 1024 ranks" \
  "$pptrain" schedule --schedule 1f1b --pp 5000000 --microbatches 8
expect_error "too many microbatches" "stage-microbatches, more than the 1048576" \
  "$pptrain" schedule --schedule zb-v --pp 8 --microbatches 100000
expect_error "too many microbatches over the steps" \
  "--microbatches 2048 x --steps 3 = 6144 on 256 stages makes" \
  "$pptrain" schedule --schedule pipedream --pp 256 --microbatches 2048
expect_error "too many partition workers" "more than 1024 workers" \
  "$pptrain" partition --profile "$(dirname "$0")/../data/pipedream/resnet50/graph.txt" --method pipedream --workers 100000

expect_error "malloc setting" "PPTRAIN_MALLOC must be 'pptrain' or 'system', got 'bad'" \
  env PPTRAIN_MALLOC=bad "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 2
expect_error "malloc setting, plan" "PPTRAIN_MALLOC must be 'pptrain' or 'system', got 'bad'" \
  env PPTRAIN_MALLOC=bad "$pptrain" plan --profile nowhere.json --workers 2 --memory-limit 0 --out "$work/p"
expect_error "unknown schedule" "unknown schedule 'nope'" "$pptrain" schedule --schedule nope --pp 2 --microbatches 2
expect_error "zero microbatches" "microbatches" "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 0
printf '0F0,1F0\n0B0\n' >"$work/bad.csv"
expect_error "stage on two ranks" "stage 0 also appears" "$pptrain" schedule --import "$work/bad.csv"
printf '0F0,999999999F0,0B0\n' >"$work/huge.csv"
expect_error "huge stage index" "no action for stage 1" "$pptrain" schedule --import "$work/huge.csv"
printf '0F0,0B0\n1F0\n' >"$work/missing.csv"
expect_error "missing backward" "rank 1" "$pptrain" schedule --import "$work/missing.csv"
expect_error "missing import file" "$work/none.csv" "$pptrain" schedule --import "$work/none.csv"
expect_error "bad cost" "cost" "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 2 --cost F=-1

# Replicated stages: chimera and gems from the registry, PipeDream's round robin from --replicas.
"$pptrain" schedule --schedule chimera --pp 4 --microbatches 8 --grid --svg "$work/chimera.svg" >"$work/out" \
  || fail "schedule chimera exited $?"
grep -q '^rank 0 | 0F0 .*3REDUCE_GRAD' "$work/out" || fail "chimera: no grid with its reductions: $(cat "$work/out")"
"$pptrain" schedule --schedule 1f1b-rr --replicas 3,1 --microbatches 6 --json >"$work/out" \
  || fail "schedule 1f1b-rr exited $?"
grep -q '"pp":4' "$work/out" || fail "1f1b-rr --replicas 3,1: not on 4 ranks: $(cat "$work/out")"
"$pptrain" schedule --schedule chimera --pp 4 --microbatches 4 --export "$work/chimera.csv" >/dev/null \
  || fail "schedule chimera --export exited $?"
"$pptrain" schedule --import "$work/chimera.csv" >/dev/null || fail "import of chimera's CSV exited $?"
expect_error "1f1b-rr without --replicas" "needs --replicas" "$pptrain" schedule --schedule 1f1b-rr --microbatches 6
expect_error "bad --replicas" "got '3,x'" "$pptrain" schedule --schedule 1f1b-rr --replicas 3,x --microbatches 6
expect_error "--replicas elsewhere" "--replicas applies to --schedule 1f1b-rr only" \
  "$pptrain" schedule --schedule 1f1b --pp 2 --microbatches 2 --replicas 1,1
expect_error "chimera odd P" "even number of ranks" "$pptrain" schedule --schedule chimera --pp 3 --microbatches 6
expect_error "chimera M" "multiple of 4" "$pptrain" schedule --schedule chimera --pp 4 --microbatches 6
expect_error "gems odd M" "multiple of 2" "$pptrain" schedule --schedule gems --pp 4 --microbatches 5

# Memory model: 1 unit = one microbatch's activations on a stage, W keeps r of it after I. zb-h1
# peaks at P (rank 0) with the default r = 0.5, zb-h2 at 2P - 1; r = 0 counts until I only.
json=$("$pptrain" schedule --schedule zb-h1 --pp 4 --microbatches 8 --json)
grep -q '"mem_w_ratio":0.5,"memory_limit":0.0' <<<"$json" || fail "schedule --json lacks the memory model: $json"
grep -q '"peak_activations":4.0,.*"peak_activations":3.5,.*"peak_activations":3.0,.*"peak_activations":2.5,' <<<"$json" \
  || fail "zb-h1 P=4 does not peak at 4, 3.5, 3, 2.5: $json"
"$pptrain" schedule --schedule zb-h2 --pp 4 --microbatches 8 --memory-limit 7 >/dev/null \
  || fail "zb-h2 P=4 does not fit --memory-limit 7"
json=$("$pptrain" schedule --schedule zb-h1 --pp 4 --microbatches 8 --mem-w-ratio 0 --json)
grep -q '"peak_activations":4.0,.*"peak_activations":3.0,.*"peak_activations":2.0,.*"peak_activations":1.0,' <<<"$json" \
  || fail "zb-h1 P=4 with --mem-w-ratio 0 does not peak at 4, 3, 2, 1: $json"
expect_error "schedule above the limit" "holds 7 units of activations on rank 0, above --memory-limit 4" \
  "$pptrain" schedule --schedule zb-h2 --pp 4 --microbatches 8 --memory-limit 4
# zb-auto plans under the limit; a limit below one microbatch's activations fits no schedule.
for limit in 1 2.5 4 8; do
  json=$("$pptrain" schedule --schedule zb-auto --pp 4 --microbatches 12 --cost F=5,I=6,W=4,comm=0.5 \
    --memory-limit "$limit" --json) || fail "zb-auto --memory-limit $limit exited $?"
  python3 -c "import json,sys; d=json.loads(sys.argv[1]); sys.exit(max(r['peak_activations'] for r in d['ranks']) > $limit)" "$json" \
    || fail "zb-auto peaks above --memory-limit $limit: $json"
done
for name in zb-auto 1f1b; do
  expect_error "$name under an impossible limit" "--memory-limit 0.5 is below what any schedule needs: the smallest limit that works is 1" \
    "$pptrain" schedule --schedule "$name" --pp 4 --microbatches 8 --memory-limit 0.5
done
# --solver ilp: zb-auto only; it reports what CBC proved, and is never longer than the greedy.
json=$("$pptrain" schedule --schedule zb-auto --pp 3 --microbatches 4 --cost F=1,I=2,W=1,comm=0.5 \
  --memory-limit 2 --solver ilp --time-limit 20 --json) || fail "zb-auto --solver ilp exited $?"
python3 -c "import json,sys; d=json.loads(sys.argv[1]); i=d['ilp']; sys.exit(not (d['solver'] == 'ilp' and i['proven_optimal'] and i['gap'] == 0 and i['objective'] <= i['heuristic'] and max(r['peak_activations'] for r in d['ranks']) <= 2))" "$json" \
  || fail "zb-auto --solver ilp on P=3 M=4 is not proven optimal within the limit: $json"
"$pptrain" schedule --schedule zb-auto --pp 2 --microbatches 3 --solver ilp | grep -q '^solver *ilp: .*proven optimal' \
  || fail "zb-auto --solver ilp prints no solver line"
# CBC is loaded when the ILP is first solved: a library that is missing, or is not CBC, is named.
PPTRAIN_CBC_LIBRARY=libpptrain-no-such-cbc.so expect_error "CBC missing" \
  "--solver ilp needs COIN-OR CBC, which could not be loaded (libpptrain-no-such-cbc.so" \
  "$pptrain" schedule --schedule zb-auto --pp 2 --microbatches 3 --solver ilp
PPTRAIN_CBC_LIBRARY=libz.so.1 expect_error "CBC replaced" \
  "--solver ilp: libz.so.1 has no function Cbc_newModel" \
  "$pptrain" schedule --schedule zb-auto --pp 2 --microbatches 3 --solver ilp
for name in 1f1b zb-h1; do
  expect_error "--solver ilp with $name" "--solver ilp applies to --schedule zb-auto only, not '$name'" \
    "$pptrain" schedule --schedule "$name" --pp 4 --microbatches 8 --solver ilp
done
expect_error "unknown solver" "--solver must be heuristic or ilp, got 'cplex'" \
  "$pptrain" schedule --schedule zb-auto --pp 4 --microbatches 8 --solver cplex
expect_error "time limit without the ILP" "--time-limit applies to --solver ilp only" \
  "$pptrain" schedule --schedule zb-auto --pp 4 --microbatches 8 --time-limit 5
expect_error "bad time limit" "--time-limit must be a number of seconds > 0, got 0" \
  "$pptrain" schedule --schedule zb-auto --pp 4 --microbatches 8 --solver ilp --time-limit 0
expect_error "bad mem-w-ratio" "--mem-w-ratio must be in .0, 1. (the share" \
  "$pptrain" schedule --schedule zb-h2 --pp 4 --microbatches 8 --mem-w-ratio 1.5
expect_error "unknown flag" "--bogus" "$pptrain" schedule --bogus

# pptrain compare with a stand-in trainer: a script that writes metrics as `pptrain train
# --metrics` does (1f1b's losses equal the --pp 1 run's, pipedream's do not; pipedream lacks
# weight_bytes and bytes_sent and spends 1.5x the compute; gpipe fails), and whose schedule list
# lacks wpipe, which compare then reports as not built.
cat >"$work/fake_pptrain" <<'FAKE'
#!/usr/bin/env bash
if [ "$1" = schedule ]; then
  printf '| schedule | chunks per rank | what it is |\n| `1f1b` | 1 | - |\n| `pipedream` | 1 | - |\n| `gpipe` | 1 | - |\n'
  exit 0
fi
[ "$1" = train ] || exit 1
while [ $# -gt 0 ]; do
  case $1 in --metrics) metrics=$2; shift ;; --schedule) schedule=$2; shift ;; esac
  shift
done
if [ "$schedule" = gpipe ]; then echo "pptrain: error: gpipe broke" >&2; echo "more" >&2; exit 1; fi
: >"$metrics"
for step in 1 2 3 4; do
  if [ "$schedule" = pipedream ]; then
    echo "{\"step\":$step,\"loss\":$((10 - step)).5,\"bubble_ratio\":0.1,\"peak_activation_bytes\":[20,10],\"optimizer_state_bytes\":[5,5],\"compute_s\":[1,2]}" >>"$metrics"
  else
    echo "{\"step\":$step,\"loss\":$((10 - step)),\"bubble_ratio\":0.2,\"peak_activation_bytes\":[10,10],\"optimizer_state_bytes\":[5,5],\"compute_s\":[1,1],\"bytes_sent\":[8,8],\"weight_bytes\":[5,5]}" >>"$metrics"
  fi
done
FAKE
chmod +x "$work/fake_pptrain"
compare_out="$work/compare"
"$pptrain" compare --pptrain "$work/fake_pptrain" --out "$compare_out" --steps 4 \
  --only 1f1b,PipeDream,gpipe,wpipe >"$work/compare.log" 2>&1 || fail "compare exited $?: $(cat "$work/compare.log")"
for file in compare.md compare.json losses.svg runs/1f1b.jsonl runs/pipedream.jsonl runs/reference-pp1.jsonl; do
  [ -s "$compare_out/$file" ] || fail "compare did not write $file"
done
[ "$(grep -c '^compare: \[' "$work/compare.log")" -eq 5 ] || fail "compare: not one progress line per run: $(cat "$work/compare.log")"
md="$compare_out/compare.md"
grep -q '^| DAPPLE | `1f1b` | sync \[Sync\] | 0.273 / 0.200 | 1.000 | 1.000 |' "$md" || fail "compare: DAPPLE's row: $(grep DAPPLE "$md")"
grep -q '^| PipeDream | `pipedream` | async \[Async\] | 0.111 / 0.100 | 1.083 | 1.06[23] | \[Good\] | n/a \[X\] | 2.00 | 1.50 \[ \] | n/a \[ \] |' "$md" \
  || fail "compare: PipeDream's row: $(grep PipeDream "$md")"
grep -q '^| GPipe | `gpipe` | failed: pptrain: error: gpipe broke \[Sync\] |' "$md" || fail "compare: GPipe's row: $(grep GPipe "$md")"
grep -q '^| WPipe | `wpipe` | not built \[Async\] |' "$md" || fail "compare: WPipe's row: $(grep WPipe "$md")"
grep -q '^- PipeDream: survey has no extra compute, measured 1.50x' "$md" || fail "compare: the compute disagreement is missing"
[ "$(grep -c '^- ' "$md")" -eq 1 ] || fail "compare: other disagreements than PipeDream's compute: $(grep '^- ' "$md")"
grep -q '"memory_ratio": null' "$compare_out/compare.json" || fail "compare.json: an absent field is not null"
grep -q '"status": "failed: pptrain: error: gpipe broke"' "$compare_out/compare.json" || fail "compare.json: GPipe's status"
if [ -n "$rsvg" ]; then
  "$rsvg" -o "$work/losses.png" "$compare_out/losses.svg" || fail "rsvg-convert could not render losses.svg"
fi
expect_error "compare without --out" "--out" "$pptrain" compare --pptrain "$work/fake_pptrain"
expect_error "compare bad --only" "--only: unknown approach 'nosuch'" \
  "$pptrain" compare --pptrain "$work/fake_pptrain" --out "$work/c2" --only 1f1b,nosuch
expect_error "compare empty --only" "--only: no approach named" \
  "$pptrain" compare --pptrain "$work/fake_pptrain" --out "$work/c2" --only ""
expect_error "compare bad --steps" "--steps must be >= 1" \
  "$pptrain" compare --pptrain "$work/fake_pptrain" --out "$work/c2" --steps 0
expect_error "compare bad --loss-at" "--loss-at must be 1 .. --steps" \
  "$pptrain" compare --pptrain "$work/fake_pptrain" --out "$work/c2" --steps 4 --loss-at 5
expect_error "compare bad --pptrain" "--pptrain: '/nonexistent' is not an executable" \
  "$pptrain" compare --pptrain /nonexistent --out "$work/c2"
expect_error "compare bad --batch-size" "--batch-size must be a positive multiple" \
  "$pptrain" compare --pptrain "$work/fake_pptrain" --out "$work/c2" --batch-size 20

# The joint planner: a ranked table, the winner's files (plan.json, a partition train reads, a
# schedule CSV schedule --import reads, an SVG), one-line errors, and the smallest peak when
# nothing fits.
vgg="$(dirname "$0")/../data/pipedream/vgg16/graph.txt"
plan_out="$work/plan"
"$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 20e9 --batch 16 --microbatches 4-16 \
  --out "$plan_out" >"$work/plan.txt" || fail "plan exited $?"
grep -q '^  #  partition .* schedule .* step ms .* bubble .* peak MB/rank$' "$work/plan.txt" \
  || fail "plan: no ranked table header: $(cat "$work/plan.txt")"
[ "$(grep -cE '^ +[0-9]+  ' "$work/plan.txt")" -eq 10 ] || fail "plan: the table has not 10 rows: $(cat "$work/plan.txt")"
grep -qE '^[0-9]+ candidates evaluated in [0-9.]+ s, [0-9]+ fit \([0-9]+ simulated' "$work/plan.txt" \
  || fail "plan: no count of candidates: $(sed -n 3p "$work/plan.txt")"
grep -q "^backward split: assumed W = 0.00 of each layer's backward, I the rest" "$work/plan.txt" \
  || fail "plan: the header does not state the I/W split it assumes: $(head -3 "$work/plan.txt")"
for file in plan.json partition.json schedule.csv timeline.svg; do
  [ -s "$plan_out/$file" ] || fail "plan did not write $file"
done
for field in '"format": "pptrain-plan-1"' '"winner"' '"schedule"' '"chunks"' '"microbatches"' \
  '"recompute"' '"stage_layers"' '"step_ms"' '"bubble_ratio"' '"peak_bytes"' '"ranked"'; do
  grep -q -- "$field" "$plan_out/plan.json" || fail "plan.json lacks $field"
done
winner_ms=$(grep -m1 '"step_ms"' "$plan_out/plan.json" | tr -dc '0-9.')
grep -qE "^ +1  .* ${winner_ms:0:6}" "$work/plan.txt" || fail "plan: row 1 is not plan.json's winner ($winner_ms)"
"$pptrain" schedule --import "$plan_out/schedule.csv" --json >/dev/null || fail "plan's schedule.csv does not import"
grep -q '"first_layer"' "$plan_out/partition.json" || fail "plan's partition.json is not a partition"
if [ -n "$rsvg" ]; then
  "$rsvg" -o "$work/plan.png" "$plan_out/timeline.svg" || fail "rsvg-convert could not render plan's timeline.svg"
fi
"$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 20e9 --batch 16 --schedules 1f1b \
  --json --out "$work/plan2" | grep -q '"schedule": "1f1b"' || fail "plan --json does not print the plan"
# The SVG is written on a thread of its own: its failure is still the one-line error.
mkdir -p "$work/plan_svg/timeline.svg"
expect_error "plan: SVG not writable" "cannot write SVG file '$work/plan_svg/timeline.svg'" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 20e9 --batch 16 --schedules 1f1b \
  --out "$work/plan_svg"
expect_error "plan: limit too small" "no plan fits the memory limit of 1000.0 MB (1e+09 bytes) per rank less its margin of 5%; the smallest peak of the" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --out "$work/plan3"
expect_error "plan: limit too small names the rank" "bytes, on rank 0: interleaved-1f1b, M=16, recompute)" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --out "$work/plan3"
# Issue 32's row: under a limit where 1F1B fits, zb-auto on the same cut, M and recomputation is
# never slower (it used to plan under the largest rank's weights and serialise the pipeline).
json=$("$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 20e9 --batch 16 --partitions time \
  --microbatches 16 --recompute on --schedules 1f1b,zb-auto --json --out "$work/plan4") || fail "plan exited $?"
python3 -c "import json,sys; r={c['schedule']: c['step_ms'] for c in json.loads(sys.argv[1])['ranked']}; sys.exit(not r['zb-auto'] <= r['1f1b'] * (1 + 1e-9))" "$json" \
  || fail "plan: zb-auto is slower than 1f1b where 1f1b fits: $json"
expect_error "plan: w-fraction above 1" "w-fraction must be in \[0, 1\]" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 0 --w-fraction 1.5 --out "$work/plan3"
cat >"$work/split.json" <<'JSON'
{"format": "pptrain-profile-1", "layers": [
  {"name": "a", "forward_ms": 1, "backward_input_ms": 1, "backward_weight_ms": 1, "activation_bytes": 10, "stash_bytes": 10, "parameter_bytes": 10},
  {"name": "b", "forward_ms": 1, "backward_input_ms": 1, "backward_weight_ms": 1, "activation_bytes": 10, "stash_bytes": 10, "parameter_bytes": 10}]}
JSON
"$pptrain" plan --profile "$work/split.json" --workers 2 --memory-limit 0 --out "$work/plan5" \
  | grep -q "^backward split: the profile's own I and W times" || fail "plan: a split profile's header"
expect_error "plan: w-fraction with a split profile" "--w-fraction 0.5 applies to a profile with one backward time per layer" \
  "$pptrain" plan --profile "$work/split.json" --workers 2 --memory-limit 0 --w-fraction 0.5 --out "$work/plan5"
expect_error "plan: zero workers" "--workers must be >= 1" \
  "$pptrain" plan --profile "$vgg" --workers 0 --memory-limit 1e9 --out "$work/plan3"
expect_error "plan: margin of the whole limit" "memory margin must be in \[0, 1)" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --memory-margin 1 --out "$work/plan3"
# --explain: the winner's memory model in parts, a line per rank that sums to its peak.
"$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 20e9 --batch 16 --schedules 1f1b \
  --explain --out "$work/plan6" >"$work/plan6.txt" || fail "plan --explain exited $?"
grep -q "weights + gradients + optimizer + data + activations + messages + transient = predicted" \
  "$work/plan6.txt" || fail "plan --explain: no memory parts: $(cat "$work/plan6.txt")"
[ "$(grep -cE '^  rank [0-3] ' "$work/plan6.txt")" -eq 4 ] || fail "plan --explain: not a line per rank"
expect_error "plan: negative limit" "--memory-limit must be >= 0 bytes" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit -1 --out "$work/plan3"
expect_error "plan: M not dividing the batch" "microbatches 3 does not divide the batch of 16" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --batch 16 --microbatches 4,3 --out "$work/plan3"
expect_error "plan: bad microbatches" "--microbatches must be a list" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --microbatches 4-x --out "$work/plan3"
expect_error "plan: asynchronous schedule" "schedule 'pipedream' is asynchronous" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --schedules 1f1b,pipedream --out "$work/plan3"
expect_error "plan: unknown partition" "nope" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --partitions time,nope --out "$work/plan3"
expect_error "plan: bad recompute" "--recompute must be both, on or off" \
  "$pptrain" plan --profile "$vgg" --workers 4 --memory-limit 1e9 --recompute maybe --out "$work/plan3"
expect_error "plan: no limit given" "memory-limit" "$pptrain" plan --profile "$vgg" --workers 4 --out "$work/plan3"
expect_error "plan: missing profile" "$work/none.json" \
  "$pptrain" plan --profile "$work/none.json" --workers 4 --memory-limit 1e9 --out "$work/plan3"

# The planner is one program without LibTorch; train and profile are pptrain-runtime's, run by
# pptrain in its place (docs/ARCHITECTURE.md, "Two programs").
if ldd "$pptrain" | grep -q libtorch; then fail "pptrain links LibTorch"; fi
version=$("$pptrain" --version) || fail "--version exited $?"
grep -Eq '^pptrain [0-9]+\.[0-9]+\.[0-9]+$' <<<"$version" || fail "--version lacks pptrain's version: $version"
grep -Eq '^LibTorch ([0-9.]+|none)$' <<<"$version" || fail "--version lacks LibTorch's version: $version"
runtime="$(dirname "$pptrain")/pptrain-runtime"
if [ -x "$runtime" ]; then
  for command in train profile; do
    listed=$("$pptrain" --help | grep -E "^ +$command ")
    own=$("$runtime" --help | grep -E "^ +$command ")
    [ -n "$listed" ] && [ "$listed" = "$own" ] \
      || fail "pptrain --help lists $command as '$listed', pptrain-runtime as '$own'"
  done
  train_help=$("$pptrain" train --help)
  grep -q -- "--microbatches" <<<"$train_help" || fail "pptrain train --help lacks the train flags"
  expect_error "runtime flag error" "--model is required" "$pptrain" train
  expect_error "train without --pp" "--pp is required (or --plan FILE)" \
    "$pptrain" train --model gpt --microbatches 2 --batch-size 4 --steps 1
  # train --plan runs the planner's winner: a profile of gpt --layers 4 (embedding, 4 blocks,
  # head), planned for 2 workers.
  {
    printf '{"format": "pptrain-profile-1", "settings": {"microbatch_size": 1}, "layers": ['
    for l in 0 1 2 3 4 5; do
      [ "$l" -gt 0 ] && printf ','
      printf '{"name": "l%d", "forward_ms": %d, "backward_input_ms": 1, "backward_weight_ms": 1, ' "$l" $((1 + l % 2))
      printf '"activation_bytes": 1000, "stash_bytes": 5000, "parameter_bytes": 20000}'
    done
    printf ']}\n'
  } >"$work/gpt4.json"
  "$pptrain" plan --profile "$work/gpt4.json" --workers 2 --memory-limit 0 --batch 4 \
    --schedules 1f1b,zb-h1 --out "$work/gptplan" >/dev/null || fail "plan for gpt4 exited $?"
  train_args=(--model gpt --layers 4 --d-model 32 --heads 2 --seq-len 16 --steps 1)
  "$pptrain" train --plan "$work/gptplan/plan.json" "${train_args[@]}" >"$work/train_plan.txt" 2>&1 \
    || fail "train --plan exited $?: $(tail -3 "$work/train_plan.txt")"
  planned=$(grep -m1 '"schedule"' "$work/gptplan/plan.json" | sed 's/.*"schedule": *"\([^"]*\)".*/\1/')
  grep -q "with $planned" "$work/train_plan.txt" \
    || fail "train --plan does not name the planned schedule '$planned': $(head -2 "$work/train_plan.txt")"
  expect_error "train --plan with another --pp" "--pp 3 contradicts --plan" \
    "$pptrain" train --plan "$work/gptplan/plan.json" "${train_args[@]}" --pp 3
  expect_error "train --plan with another --microbatches" "--microbatches 3 contradicts --plan" \
    "$pptrain" train --plan "$work/gptplan/plan.json" "${train_args[@]}" --microbatches 3
  expect_error "train --plan with --dp" "is for one pipeline" \
    "$pptrain" train --plan "$work/gptplan/plan.json" "${train_args[@]}" --dp 2
  expect_error "train --plan of a missing file" "cannot read plan file" \
    "$pptrain" train --plan "$work/none/plan.json" "${train_args[@]}"
  grep -q '^LibTorch none$' <<<"$version" && fail "--version says no LibTorch, but the runtime is built"
else
  expect_error "train without a runtime" "PPTRAIN_BUILD_RUNTIME=OFF" "$pptrain" train --pp 2
fi

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all CLI checks passed"
