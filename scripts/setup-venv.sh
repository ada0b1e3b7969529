#!/usr/bin/env bash
# Makes the Python environment pptrain builds against: a virtual environment (default .venv/ in
# the repository root) with requirements.txt installed from the Python package registry. Run
# again, it only installs what is missing. PPTRAIN_TORCH=2.15.0 takes that torch instead of the
# pinned one (scripts/check_newest_torch.sh); PPTRAIN_BASE_PYTHON names the interpreter the
# environment is made from (default: python3 on the PATH).
#
#   scripts/setup-venv.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
base=${PPTRAIN_BASE_PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
requirements=requirements.txt
if [ -n "${PPTRAIN_TORCH:-}" ]; then
  requirements=$(mktemp)
  trap 'rm -f "$requirements"' EXIT
  sed "s/^torch==.*/torch==$PPTRAIN_TORCH/" requirements.txt > "$requirements"
fi
"$venv/bin/python" -m pip install -q -r "$requirements"
"$venv/bin/python" -c 'import torch; print("setup-venv: torch", torch.__version__, "in", torch.__path__[0])'
