#!/usr/bin/env bash
# examples/cluster as a user would take them: the sbatch script and the mpirun line are valid
# bash, the PyTorchJob manifest is valid YAML of a PyTorchJob (python3-yaml), each starts as
# many ranks as its --pp asks for, and every flag they give `pptrain train` is one its --help
# lists.
#   tests/cluster_examples_test.sh PPTRAIN_BINARY
set -euo pipefail
binary=$1
examples="$(dirname "$0")/../examples/cluster"
fail() { echo "FAIL: $*"; exit 1; }

for script in train.sbatch mpirun.sh; do
  bash -n "$examples/$script" || fail "$script is not valid bash"
done
"$binary" train --help >/dev/null 2>&1 || fail "pptrain train --help"
known=$("$binary" train --help | grep -oE -- '--[a-z0-9-]+' | sort -u)
# The long flags of `pptrain train ...` in file $1 (continued lines joined), one per line.
train_flags() {
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$1" | grep -o 'pptrain train .*' | grep -oE -- '--[a-z0-9-]+' |
    sort -u
}
# The value of --pp in file $1.
pp_of() { grep -oE -- '--pp[ =][0-9]+' "$1" | grep -oE '[0-9]+$'; }
check_flags() {
  local unknown
  unknown=$(comm -23 <(echo "$2") <(echo "$known") | tr '\n' ' ')
  [ -z "$unknown" ] || fail "$1 gives pptrain train flags it does not know: $unknown"
}

check_flags train.sbatch "$(train_flags "$examples/train.sbatch")"
nodes=$(sed -n 's/^#SBATCH --nodes=//p' "$examples/train.sbatch")
tasks=$(sed -n 's/^#SBATCH --ntasks-per-node=//p' "$examples/train.sbatch")
[ "$((nodes * tasks))" = "$(pp_of "$examples/train.sbatch")" ] ||
  fail "train.sbatch starts $nodes x $tasks tasks for --pp $(pp_of "$examples/train.sbatch")"
echo "train.sbatch: $nodes nodes x $tasks tasks = --pp $(pp_of "$examples/train.sbatch")"

check_flags mpirun.sh "$(train_flags "$examples/mpirun.sh")"
np=$(grep -oE 'mpirun -np [0-9]+' "$examples/mpirun.sh" | grep -oE '[0-9]+$')
[ "$np" = "$(pp_of "$examples/mpirun.sh")" ] || fail "mpirun.sh starts $np ranks for another --pp"
echo "mpirun.sh: -np $np = --pp"

flags=$("${PPTRAIN_PYTHON:-python3}" - "$examples/pytorchjob.yaml" <<'PY'
import sys, yaml
with open(sys.argv[1]) as f:
    job = yaml.safe_load(f)
assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob", "not a PyTorchJob"
specs = job["spec"]["pytorchReplicaSpecs"]
assert set(specs) == {"Master", "Worker"}, f"replica specs {sorted(specs)}"
assert specs["Master"]["replicas"] == 1, "one Master"
pods = sum(spec["replicas"] for spec in specs.values())
for role, spec in specs.items():
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["pptrain", "train"], f"{role} runs {command[:2]}"
    pp = [int(arg.split("=")[1]) for arg in command if arg.startswith("--pp=")]
    assert pp == [pods], f"{role}: --pp {pp} for {pods} pods"
    for arg in command[2:]:
        print(arg.split("=")[0])
PY
) || fail "pytorchjob.yaml"
check_flags pytorchjob.yaml "$(echo "$flags" | sort -u)"
echo "pytorchjob.yaml: a PyTorchJob whose pods are the ranks of its --pp"
