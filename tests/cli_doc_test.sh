#!/usr/bin/env bash
# docs/CLI.md against the programs: every subcommand `pptrain --help` lists has a section
# "## `pptrain NAME`" in docs/CLI.md, and the long flags that section's "### Flags" list names
# (one bullet per flag, "- `--flag ...`: ...") are exactly the long flags `pptrain NAME --help`
# prints (--help itself aside). A flag kept out of --help (CLI11's group "") need not be listed.
# `train`, `profile` and `run` are answered by pptrain-runtime, which must sit beside pptrain.
#   tests/cli_doc_test.sh PPTRAIN_BINARY
set -uo pipefail
pptrain=$1
doc="$(dirname "$0")/../docs/CLI.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The long flags of a CLI11 help text, one per line, sorted: the first word of each option line
# (two spaces, then a dash), without what CLI11 appends after it (types, "Excludes: --x").
help_flags() {
  grep -E '^  -' | awk '{print $1}' | grep -oE -- '--[a-z0-9][a-z0-9-]*' | grep -vx -- '--help' |
    sort -u
}

# The flags listed in docs/CLI.md's section for subcommand $1, one per line, sorted.
doc_flags() {
  awk -v heading="## \`pptrain $1\`" '
    $0 == heading { in_section = 1; next }
    in_section && /^## / { in_section = 0 }
    in_section && /^### / { in_flags = ($0 == "### Flags"); next }
    in_section && in_flags && /^- `--/ { print }
  ' "$doc" | sed -E 's/^- `(--[a-z0-9][a-z0-9-]*).*/\1/' | sort -u
}

# The subcommands of `pptrain --help`: the lines of its "Subcommands:" block.
"$pptrain" --help >"$work/top" 2>&1 || fail "pptrain --help exited $?"
awk 'tolower($0) ~ /^subcommands:$/ { on = 1; next } on && /^$/ { on = 0 } on && /^  [a-z]/ { print $1 }' \
  "$work/top" >"$work/subcommands"
[ -s "$work/subcommands" ] || { fail "no subcommands found in pptrain --help:"; cat "$work/top"; }

while IFS= read -r sub; do
  if ! grep -qxF -- "## \`pptrain $sub\`" "$doc"; then
    fail "docs/CLI.md has no section '## \`pptrain $sub\`'"
    continue
  fi
  if ! "$pptrain" "$sub" --help >"$work/help" 2>&1; then
    fail "pptrain $sub --help exited non-zero:"
    cat "$work/help"
    continue
  fi
  help_flags <"$work/help" >"$work/from_help"
  doc_flags "$sub" >"$work/from_doc"
  [ -s "$work/from_help" ] || fail "pptrain $sub --help printed no long flags"
  missing=$(comm -23 "$work/from_help" "$work/from_doc" | tr '\n' ' ')
  extra=$(comm -13 "$work/from_help" "$work/from_doc" | tr '\n' ' ')
  [ -z "$missing" ] || fail "docs/CLI.md's flags of '$sub' lack what --help prints: $missing"
  [ -z "$extra" ] || fail "docs/CLI.md's flags of '$sub' list what --help does not print: $extra"
  echo "$sub: $(wc -l <"$work/from_help") flags"
done <"$work/subcommands"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "docs/CLI.md lists every flag of $(wc -l <"$work/subcommands") subcommands"
