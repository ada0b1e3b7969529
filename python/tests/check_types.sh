#!/usr/bin/env bash
# The package's types, as the build tree has it: mypy --strict over pptrain.plan,
# pptrain/__init__.py and pptrain.runtime, plain mypy over pptrain.pipelining (torch's names are
# Any there), and mypy's stubtest of _plan.pyi and _runtime.pyi against the built extensions (a
# name bound in plan_module.cpp or runtime_module.cpp and missing from its stub fails). Skips
# (exit 77) without mypy in that Python (scripts/setup-venv.sh installs it).
#
#   python/tests/check_types.sh BUILD/python [PYTHON]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${2:-python3}
"$python" -c "import mypy" 2> /dev/null || { echo "skipped: $python has no mypy (pip install mypy)"; exit 77; }
cd "$1"
mypy=("$python" -m mypy --config-file "$here/mypy.ini")
# The runtime's half when its extension is built (it needs libtorch_python).
runtime=()
compgen -G "pptrain/_runtime*.so" > /dev/null && runtime=(pptrain/runtime.py)
"${mypy[@]}" --strict pptrain/plan.py pptrain/__init__.py "${runtime[@]}"
"${mypy[@]}" pptrain/pipelining
modules=(pptrain._plan)
((${#runtime[@]} == 0)) || modules+=(pptrain._runtime)
"$python" -m mypy.stubtest --mypy-config-file "$here/mypy.ini" \
  --allowlist "$here/stubtest_allowlist.txt" "${modules[@]}"
