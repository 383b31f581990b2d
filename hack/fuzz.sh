#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every fuzz target of the module, one after another.
#   FUZZTIME   how long each target runs: a count of executions (200000x,
#              the default, since timed runs can stall under heavy load on
#              Go 1.26) or a duration (FUZZTIME=60s)
#   FUZZ_PKGS  packages to search (default ./...)
# go test ./... runs each target for 2000 executions (test/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-200000x}
pkgs=${FUZZ_PKGS:-./...}
for pkg in $(go list $pkgs); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "== $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel 1 "$pkg"
  done
done
