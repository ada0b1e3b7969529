#!/usr/bin/env bash
# The examples as a user builds them: installs the build BUILD_DIR into a scratch prefix, copies
# each examples/NN_* folder alone into a fresh directory, configures and builds it there against
# the prefix (find_package(pptrain)), and checks what its README promises:
#   01_two_stage_mlp: `pptrain run --nproc 2` prints the losses of the one-rank run (1e-5);
#                     `pptrain run` with a rank that fails stops the other and names it;
#   02_own_transformer_zero_bubble: zb-h1 and zb-v on 2 and 4 ranks, I/W split by autograd and
#                     fused, print the losses of the one-rank run (1e-5);
#   03_torchrun_multi_host: two ranks started by hand (RANK, MASTER_ADDR, MASTER_PORT), and two
#                     with srun's variables instead (SLURM_PROCID, ...), print the losses of the
#                     one-rank run.
# It also checks that the README's "Use pptrain in your own program" code is example 01's.
#   tests/examples_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*"; exit 1; }

# The README's code is the example's code, so building the example compiles it.
sed -n '/^<!-- own-program:begin -->$/,/^<!-- own-program:end -->$/p' "$root/README.md" |
  sed '1,2d;$d' | sed '$d' >"$work/readme.cpp"
diff -u "$root/examples/01_two_stage_mlp/main.cpp" "$work/readme.cpp" ||
  fail "the README's own-program code differs from examples/01_two_stage_mlp/main.cpp"
lines=$(wc -l <"$work/readme.cpp")
((lines < 40)) || fail "the README's own-program code has $lines lines (at most 39)"
readme_lines=$(wc -l <"$root/README.md")
((readme_lines <= 150)) ||
  fail "README.md has $readme_lines lines (at most 150: a tour; the reference is in docs/)"

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")

# Copies example $1 alone into the scratch folder and builds it there; prints the build folder.
build_example() {
  cp -r "$root/examples/$1" "$work/$1"
  cmake -S "$work/$1" -B "$work/$1/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$work/prefix" ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} \
    >"$work/$1.configure.log" 2>&1 || { cat "$work/$1.configure.log" >&2; return 1; }
  cmake --build "$work/$1/build" >"$work/$1.build.log" 2>&1 || { cat "$work/$1.build.log" >&2; return 1; }
  echo "$work/$1/build"
}

# Fails unless the "step K loss X" lines of two outputs agree to 1e-5 relative, step by step.
same_losses() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    na = split(a, x, "\n"); nb = split(b, y, "\n"); if (na != nb || na == 0) exit 1
    for (i = 1; i <= na; i++) {
      split(x[i], u, " "); split(y[i], v, " ")
      d = u[4] - v[4]; if (d < 0) d = -d; s = u[4] < 0 ? -u[4] : u[4]
      if (u[2] != v[2] || d > 1e-5 * s + 1e-12) exit 1
    }
  }'
}

pptrain="$work/prefix/bin/pptrain"
ex01=$(build_example 01_two_stage_mlp)
one=$(cd "$work" && "$ex01/two_stage_mlp" | grep '^step')
two=$(cd "$work" && timeout 120 "$pptrain" run --nproc 2 "$ex01/two_stage_mlp" | grep '^step')
echo "one rank:"; echo "$one"; echo "two ranks:"; echo "$two"
[[ $(wc -l <<<"$one") -eq 5 ]] || fail "example 01 printed no 5 losses on one rank"
same_losses "$one" "$two" || fail "example 01's two-rank losses differ from its one-rank losses"

ex02=$(build_example 02_own_transformer_zero_bubble)
one=$(cd "$work" && "$ex02/own_transformer" | grep '^step')
echo "02, one rank:"; echo "$one"
[[ $(wc -l <<<"$one") -eq 4 ]] || fail "example 02 printed no 4 losses on one rank"
for ranks in 2 4; do
  for schedule in zb-h1 zb-v; do
    for fused in "" --fused; do
      got=$(cd "$work" && timeout 300 "$pptrain" run --nproc $ranks "$ex02/own_transformer" \
              --schedule $schedule $fused | grep '^step')
      same_losses "$one" "$got" ||
        fail "example 02, $schedule on $ranks ranks ${fused:-split}: $got"
      echo "02, $schedule on $ranks ranks ${fused:-(autograd split)}: the one-rank losses"
    done
  done
done

ex03=$(build_example 03_torchrun_multi_host)
one=$(cd "$work" && "$ex03/multi_host" | grep '^step')
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))
(cd "$work" && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
   timeout 120 "$ex03/multi_host" >"$work/rank0.out" 2>&1) &
rank0=$!
two=$(cd "$work" && RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 120 "$ex03/multi_host" | grep '^step') || fail "example 03's rank 1 failed"
wait $rank0 || { cat "$work/rank0.out"; fail "example 03's rank 0 failed"; }
same_losses "$one" "$two" || fail "example 03's hand-started ranks differ from one rank: $two"
echo "03, two ranks started by hand: the one-rank losses"

# The same program under srun's variables and no RANK: init_from_env() finds Slurm, rank 0 says so.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))
srun_env() {
  echo SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=$1 SLURM_LOCALID=$1 \
    "SLURM_JOB_NODELIST=127.0.0.[1-2]" MASTER_PORT=$port
}
(cd "$work" && env $(srun_env 0) timeout 120 "$ex03/multi_host" >"$work/srun0.out" 2>&1) &
rank0=$!
two=$(cd "$work" && env $(srun_env 1) timeout 120 "$ex03/multi_host" | grep '^step') ||
  fail "example 03's rank 1 under srun's variables failed"
wait $rank0 || { cat "$work/srun0.out"; fail "example 03's rank 0 under srun's variables failed"; }
same_losses "$one" "$two" || fail "example 03 under srun's variables differs from one rank: $two"
grep -q "^pptrain: launcher found: slurm: rank 0 of 2, master 127.0.0.1:$port" "$work/srun0.out" ||
  fail "example 03's rank 0 did not name Slurm: $(cat "$work/srun0.out")"
echo "03, two ranks with srun's variables: the one-rank losses"

# pptrain run: a rank that exits 1 stops the others, and the run names it.
cat >"$work/fail_rank1.sh" <<'SH'
#!/usr/bin/env bash
if [[ $RANK == 1 ]]; then exit 1; fi
exec sleep 60
SH
chmod +x "$work/fail_rank1.sh"
start=$SECONDS
status=0
out=$(timeout 60 "$pptrain" run --nproc 2 "$work/fail_rank1.sh" 2>&1) || status=$?
((status != 0 && status != 124)) || fail "pptrain run with a failing rank exited $status"
grep -q "rank 1 exited with status 1" <<<"$out" || fail "pptrain run did not name rank 1: $out"
((SECONDS - start < 30)) || fail "pptrain run took $((SECONDS - start)) s to stop rank 0"
echo "pptrain run: $out"
echo "the examples build against the installed package and keep their promises"
