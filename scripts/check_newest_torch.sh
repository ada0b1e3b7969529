#!/usr/bin/env bash
# Builds pptrain against the newest torch on the Python package registry (or PPTRAIN_TORCH=X.Y.Z)
# in an environment and a build tree of its own (.venv-newest/, build-newest/), and runs the
# planner's and the runtime's unit tests there. The project's own torch stays the one pinned in
# requirements.txt; this says whether the code is ready for the next. About 20 minutes on two
# cores (the wheel and its CUDA libraries are a few GB; 2026-12-01, torch 2.15.0+cu132, built as
# C++20 and 399/399 unit tests passed).
#
#   scripts/check_newest_torch.sh            # the newest torch
#   PPTRAIN_TORCH=2.13.0 scripts/check_newest_torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-newest
tree=build-newest
version=${PPTRAIN_TORCH:-}
if [ -z "$version" ]; then
  version=$(python3 -m pip index versions torch 2> /dev/null | sed -n 's/^torch (\(.*\))$/\1/p')
  [ -n "$version" ] || { echo "check_newest_torch: the registry named no torch version" >&2; exit 1; }
fi
echo "check_newest_torch: torch $version"
PPTRAIN_TORCH=$version bash scripts/setup-venv.sh "$venv"
cmake -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DPPTRAIN_PYTHON="$PWD/$venv/bin/python" > /dev/null
cmake --build "$tree" -j"$(nproc)" --target pptrain_plan_tests pptrain_runtime_tests
ctest --test-dir "$tree" --output-on-failure -j"$(nproc)" -L 'plan|runtime' \
  -E 'python_|install_consumer|layer_check|circle_check|format_check|cli_checks|examples'
echo "check_newest_torch: torch $version: built, and the unit tests passed"
