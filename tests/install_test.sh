#!/usr/bin/env bash
# The installed package works for a project outside this tree: installs the build BUILD_DIR into
# a scratch prefix, configures and builds tests/consumer against it with find_package(pptrain),
# runs it and checks the bubble it prints (1F1B, P=4, M=8: 3/11).
#   tests/install_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" \
  || { cat "$work/install.log"; exit 1; }
for file in include/pptrain/generators/generators.h lib/cmake/pptrain/pptrainConfig.cmake bin/pptrain; do
  [[ -e "$work/prefix/$file" ]] || { echo "FAIL: the install lacks $file"; exit 1; }
done
if find "$work/prefix/include" -name '*_test.cpp' -o -name 'testing.h' | grep -q .; then
  echo "FAIL: test files were installed:"; find "$work/prefix/include" -name '*test*'; exit 1
fi

# The installed pptrain finds the installed pptrain-runtime beside it.
if [[ -x "$work/prefix/bin/pptrain-runtime" ]]; then
  help=$("$work/prefix/bin/pptrain" train --help)
  grep -q -- --microbatches <<<"$help" \
    || { echo "FAIL: the installed pptrain does not run the installed pptrain-runtime"; exit 1; }
fi

# The consumer builds with the compiler of this build, out of this tree, in Release.
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
out=$("$work/consumer/consumer")
echo "$out"
grep -q 'bubble ratio 0.2727' <<<"$out" || { echo "FAIL: expected a bubble ratio of 0.2727"; exit 1; }
echo "the installed package builds and runs a consumer"
