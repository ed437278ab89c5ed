#!/usr/bin/env bash
# Runs every Go fuzz target in the module for FUZZTIME each (default 30s).
set -euo pipefail
cd "$(dirname "$0")/../.."
t=${FUZZTIME:-30s}
mapfile -t targets < <(grep -rl --include='*_test.go' '^func Fuzz' . | sort)
for f in "${targets[@]}"; do
  pkg=./$(dirname "${f#./}")
  for fn in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | awk '{print $2}'); do
    echo "== $pkg $fn ($t)"
    go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$t" "$pkg"
  done
done
