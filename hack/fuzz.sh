#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every fuzz target of the module, one after another.
#   FUZZTIME   how long each target runs: a count of executions (200000x,
#              the default, since timed runs can stall under heavy load on
#              Go 1.26) or a duration (FUZZTIME=60s)
#   FUZZ_PKGS  packages to search (default ./...)
# go test ./... runs each target for 2000 executions (test/fuzz). Both
# build with the pxnseams tag: libpxn's fuzz targets drive the C ABI
# through seams that the shipped library leaves out.
# Then the Mooncake transport's libFuzzer targets (hack/fuzz-mooncake.sh)
# for as many executions or seconds, when FUZZ_PKGS is unset or names
# integrations/mooncake; without clang++ they are skipped with the reason,
# or fail under PXN_REQUIRE_TOOLS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-200000x}
pkgs=${FUZZ_PKGS:-./...}
for pkg in $(go list $pkgs); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "== $pkg $target ($fuzztime)"
    go test -tags pxnseams -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel 1 "$pkg"
  done
done

if [[ -n ${FUZZ_PKGS:-} && $FUZZ_PKGS != *integrations/mooncake* ]]; then
  exit 0
fi
if [[ $fuzztime =~ ^([0-9]+)x$ ]]; then
  flag=-runs=${BASH_REMATCH[1]}
elif [[ $fuzztime =~ ^([0-9]+)s$ ]]; then
  flag=-max_total_time=${BASH_REMATCH[1]}
elif [[ $fuzztime =~ ^([0-9]+)m$ ]]; then
  flag=-max_total_time=$((BASH_REMATCH[1] * 60))
else
  echo "fuzz: FUZZTIME=$fuzztime: the libFuzzer targets take a count (200000x), seconds (60s) or minutes (2m)" >&2
  exit 2
fi
out=_output/fuzz-mooncake
mkdir -p "$out"
rc=0
hack/fuzz-mooncake.sh build "$out" || rc=$?
if [[ $rc -eq 3 && ${PXN_REQUIRE_TOOLS:-} != 1 ]]; then
  echo "== integrations/mooncake/fuzz skipped: no clang++ with libFuzzer"
  exit 0
fi
[[ $rc -eq 0 ]] || exit 1
for target in $(hack/fuzz-mooncake.sh targets); do
  echo "== integrations/mooncake/fuzz $target ($fuzztime)"
  hack/fuzz-mooncake.sh run "$out" "$target" "$flag"
done
