#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Before/after benchmarks in one run: the package's benchmarks on a baseline
# commit and on this tree, alternately, then a Markdown table of both.
#
#   hack/bench-baseline.sh [extra go test args...]
#
#   BASELINE   commit to compare against (default aa82ddc)
#   BENCH      -bench pattern (default 'Transfer|Blocks16KiB')
#   BENCHTIME  -benchtime (default 1s)
#   ROUNDS     baseline/current pairs, run A B A B ... (default 5)
#   PKG        package directory (default ./pkg/relay/); its bench_test.go
#              from this tree replaces the baseline's, so both sides run
#              the same benchmarks
#
# The baseline is checked out in _output/bench-baseline/<commit> (reused by
# later runs; delete the folder at any time). Raw outputs and the table go to
# _output/bench-baseline/runs/<UTC time>/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)

baseline=${BASELINE:-aa82ddc}
bench=${BENCH:-Transfer|Blocks16KiB}
benchtime=${BENCHTIME:-1s}
rounds=${ROUNDS:-5}
pkg=${PKG:-./pkg/relay/}
benchfile=${pkg#./}
benchfile=${benchfile%/}/bench_test.go

base=$(git rev-parse --verify --quiet "${baseline}^{commit}") ||
  { echo "baseline $baseline is not a commit of this repository" >&2; exit 1; }
[ -f "$benchfile" ] || { echo "$benchfile not found" >&2; exit 1; }

# The baseline worktree: forget registrations whose folder is gone, then
# reuse a registered one or create it.
out=$root/_output/bench-baseline
wt=$out/$base
git worktree prune
if git worktree list --porcelain | grep -qxF "worktree $wt"; then
  git -C "$wt" checkout -q --force --detach "$base"
  git -C "$wt" clean -fdq
else
  rm -rf "$wt"
  mkdir -p "$out"
  git worktree add -q --detach "$wt" "$base"
fi
cp "$benchfile" "$wt/$benchfile"

current=$(git rev-parse --short HEAD)
if [ -n "$(git status --porcelain)" ]; then current=$current-dirty; fi
started=$(date -u '+%Y-%m-%d %H:%M UTC')
run=$out/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$run"
load=$(cut -d' ' -f1-3 /proc/loadavg)

cmd=(go test -run '^$' -bench "$bench" -benchtime "$benchtime" -count 1 "$@" "$pkg")
# Odd rounds run the baseline first, even rounds the current tree, so that
# neither side always follows the other.
before() {
  echo "round $i/$rounds: baseline" >&2
  (cd "$wt" && "${cmd[@]}") >"$run/before-$i.txt"
}
after() {
  echo "round $i/$rounds: current" >&2
  "${cmd[@]}" >"$run/after-$i.txt"
}
for i in $(seq 1 "$rounds"); do
  if ((i % 2)); then before; after; else after; before; fi
done

cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
{
  echo "- date: $started"
  echo "- $(go version)"
  echo "- CPU: ${cpu:-unknown}, $(nproc) cores; load average at start: $load"
  echo "- baseline: $(git rev-parse --short "$base"); current: $current"
  echo "- command: \`go test -run '^\$' -bench '$bench' -benchtime $benchtime -count 1 ${*:+$* }$pkg\`;" \
    "rounds: $rounds, baseline and current alternating, each first in every other round"
  echo
  go run ./hack/benchtable -before "$run/before-*.txt" -after "$run/after-*.txt"
} | tee "$run/table.md"
