#!/usr/bin/env bash
# `pip install .` as a user of torch does it: a fresh virtual environment, the pinned torch
# installed into it first, then pptrain built against that torch by pip (pyproject.toml), and
# the result checked: the `pptrain` command, `import pptrain` and pptrain.runtime, and that
# pptrain-runtime and the extension link that environment's torch. About 20 minutes on two cores
# (pip's CMake tree, build-pip/, is a full build the first time).
#
#   scripts/check_pip_install.sh [ENV_DIR]     # default: a new folder under /tmp
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-$(mktemp -d /tmp/pptrain-pip.XXXXXX)}
torch_pin=$(grep '^torch==' requirements.txt)
python3 -m venv "$env_dir"
"$env_dir/bin/python" -m pip install -q "$torch_pin" numpy
"$env_dir/bin/python" -m pip install -q .
site=$("$env_dir/bin/python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "check_pip_install: $("$env_dir/bin/pptrain" --version | tr '\n' ' ')"
"$env_dir/bin/python" -c 'import pptrain.plan, sys; assert "torch" not in sys.modules, "pptrain.plan loaded torch"'
"$env_dir/bin/python" -c 'import pptrain, pptrain.runtime; print("check_pip_install: import pptrain.runtime:", pptrain.runtime.__file__)'
for binary in "$env_dir/bin/pptrain-runtime" "$env_dir"/lib/python*/site-packages/pptrain/_runtime*.so; do
  libs=$(ldd "$binary" | grep -E 'libtorch|libc10' | awk '{print $3}')
  [ -n "$libs" ] || { echo "check_pip_install: $binary links no torch" >&2; exit 1; }
  for lib in $libs; do
    case $lib in "$site"/*) ;; *) echo "check_pip_install: $binary links $lib, not $site's" >&2; exit 1 ;; esac
  done
done
"$env_dir/bin/pptrain" train --model mlp --pp 2 --microbatches 2 --batch-size 4 --steps 2 > /dev/null
echo "check_pip_install: $env_dir: pptrain installed, linked to its torch, and trained on 2 ranks"
