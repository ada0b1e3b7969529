#!/usr/bin/env bash
# Configures and builds pptrain into ./build (Release, ccache if present). Arguments go to the
# configure step, e.g. scripts/build.sh -DPPTRAIN_WERROR=ON -DPPTRAIN_SANITIZE=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null
cmake --build build -j"$(nproc)"
