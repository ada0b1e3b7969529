#!/usr/bin/env bash
# The house format (.clang-format) on every C++ file git knows of: prints the files clang-format
# would change and exits 1 if there is any. `clang-format -i FILE` fixes one.
#
#   scripts/check_format.sh [ROOT]      # default: the repository this script is in
set -euo pipefail
cd "${1:-"$(dirname "$0")/.."}"
command -v clang-format > /dev/null || { echo "check_format: clang-format is not installed"; exit 1; }
bad=0
while IFS= read -r file; do
  if ! clang-format --dry-run --Werror "$file" > /dev/null 2>&1; then
    echo "$file: not in the house format (clang-format -i $file)"
    bad=1
  fi
done < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cpp' 2>/dev/null ||
           find pptrain tools tests bench python examples -name '*.h' -o -name '*.cpp')
[ $bad = 0 ] && echo "check_format: every C++ file is in the house format"
exit $bad
