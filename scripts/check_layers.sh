#!/usr/bin/env bash
# The layer rule between the rooms (folders) of pptrain, so that no two folders depend on each
# other: a file may include a pptrain/<room>/ header of its own room or of a room on a lower
# layer, never of a higher layer nor of another room on its own layer. A unit test beside the
# code (*_test.cpp) is held to its room's rule; tools/pptrain, tests/ and bench/ may include any
# room. Prints one line per offending include (file:line: the header and why) and exits 1 if
# there is any.
#
#   scripts/check_layers.sh [ROOT]      # default: the repository this script is in
set -euo pipefail
cd "${1:-"$(dirname "$0")/.."}"

# Lowest first; docs/ARCHITECTURE.md shows the same table. Layer 11 is tools/pptrain, tests/ and
# bench/.
layers="common=0 schedule=1 partition=1 generators=2 sim=3 render=3 planner=4 device=4 compare=5 models=5 data=6 runtime=7 train=8 api=9 job=10"

# The C++ files git knows of (tracked or new), or every one when this is not a git checkout.
sources() {
  git ls-files --cached --others --exclude-standard -- pptrain tools tests bench 2>/dev/null ||
    find pptrain tools tests bench -type f
}
files=$(sources | grep -E '\.(h|hpp|cpp|cc)$')

# A new room needs its place in the table before anything else can be said about it.
unplaced=0
for dir in pptrain/*/; do
  room=$(basename "$dir")
  if [[ " $layers" != *" $room="* ]]; then
    echo "pptrain/$room/: a room without a layer; add it to scripts/check_layers.sh and docs/ARCHITECTURE.md"
    unplaced=1
  fi
done

# Every `#include "pptrain/<room>/..."` (or <...>) as file:line:text, judged in one awk pass.
# shellcheck disable=SC2086  # one argument per file
grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]pptrain/[^/]+/' $files /dev/null |
  awk -v layers="$layers" -v unplaced="$unplaced" '
    BEGIN {
      n = split(layers, pairs, " ")
      for (i = 1; i <= n; i++) { split(pairs[i], kv, "="); layer[kv[1]] = kv[2] }
      top = 11
    }
    {
      split($0, parts, ":")
      file = parts[1]; line = parts[2]
      header = $0
      sub(/^[^<"]*[<"]/, "", header); sub(/[>"].*$/, "", header)
      split(header, h, "/"); included = h[2]
      room = ""; level = top
      if (file ~ /^pptrain\/[^\/]+\//) {
        split(file, f, "/"); room = f[2]
        if (!(room in layer)) next  # reported above
        level = layer[room]
      }
      if (!(included in layer)) { print file ":" line ": includes " header ", whose room \"" included "\" has no layer"; bad++ }
      else if (included == room) { }
      else if (layer[included] > level) {
        print file ":" line ": includes " header ": " included " (layer " layer[included] ") is above " room " (layer " level ")"; bad++
      } else if (layer[included] == level) {
        print file ":" line ": includes " header ": " included " and " room " are both on layer " level " and may not include each other"; bad++
      }
    }
    END {
      if (bad || unplaced) { print "check_layers: " bad " include(s) break the layer rule (docs/ARCHITECTURE.md)"; exit 1 }
      print "check_layers: every include of a pptrain/<room>/ header follows the layer rule"
    }'
