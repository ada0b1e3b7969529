#!/usr/bin/env bash
# How long `import pptrain.plan` takes (docs/PYTHON.md promises well under 0.2 s, without torch),
# next to `import pptrain.runtime` (which loads torch), median of 5 runs each, in one run.
#   bench/python_import.sh [BUILD_DIR]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
python="${PPTRAIN_PYTHON:-.venv/bin/python}"
median() {
  local code=$1 times=()
  for _ in 1 2 3 4 5; do
    times+=("$(PYTHONPATH="$build/python" "$python" -c "import time; t = time.perf_counter(); $code; print(f'{time.perf_counter() - t:.4f}')")")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 3p
}
plan=$(median "import pptrain.plan")
runtime=$(median "import pptrain.runtime")
echo "import pptrain.plan     ${plan} s"
echo "import pptrain.runtime  ${runtime} s"
awk -v p="$plan" -v r="$runtime" 'BEGIN { printf "ratio plan / runtime  %.3f\n", p / r }'
