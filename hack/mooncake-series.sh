#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Mooncake patch as a series of commits for review upstream
# (docs/rfc-mooncake-pxn.md): integrations/mooncake/patches/series cuts
# integrations/mooncake/patches/mooncake.patch into ordered commits, which
# hack/mooncakeseries makes on a git copy of the Mooncake tree the patch is
# made against (hack/mooncake.sh tree), checking that the last commit's tree
# is the tree with the whole patch.
#
#   hack/mooncake-series.sh generate [OUT]  make the series in OUT (default
#                                           _output/mooncake-series): OUT/repo
#                                           (tag base: the Mooncake tree),
#                                           OUT/patches (git format-patch)
#   hack/mooncake-series.sh check [OUT]     generate, then build each commit's
#                                           tree as hack/mooncake.sh builds the
#                                           patched one (cached by its patch,
#                                           ccache shared) and run Mooncake's
#                                           tests there and PXN's checks the
#                                           commit has; stops at the first
#                                           failure
#
# CONFIGS: the configurations check builds (default: default; hack/mooncake.sh
# configs lists them). Builds run under nice -n 10.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
patches=$root/integrations/mooncake/patches

log() { echo "mooncake-series: $*" >&2; }
die() { echo "mooncake-series: $*" >&2; exit 1; }

generate() {
  local out=$1 tree
  tree=$("$root/hack/mooncake.sh" tree) || die "no Mooncake tree to make the series on"
  rm -rf "$out"
  mkdir -p "$(dirname "$out")"
  (cd "$root" && go run ./hack/mooncakeseries -patch "$patches/mooncake.patch" \
    -series "$patches/series" -tree "$tree" -out "$out") >"$out.list.partial"
  mv "$out.list.partial" "$out/commits"
}

# run_program BIN: runs a test program in its folder without MC_ variables,
# as the engine's Go test does; prints its last lines when it fails.
run_program() {
  local bin=$1 output
  if output=$(cd "$(dirname "$bin")" && env $(env | sed -n 's/^\(MC_[^=]*\)=.*/-u \1/p') timeout 300 "$bin" </dev/null 2>&1); then
    return 0
  fi
  echo "$output" | tail -40 >&2
  return 1
}

check() {
  local out=$1 n=0 total id stage checks subject diff dir start passed prog
  local -a configs programs
  read -r -a configs <<<"${CONFIGS:-default}"
  mapfile -t programs < <("$root/hack/mooncake.sh" tests)
  total=$(wc -l <"$out/commits")
  while IFS=$'\t' read -r id stage checks subject; do
    n=$((n + 1))
    [ "$checks" = - ] && checks=
    diff=$out/cumulative-$n.patch
    git -C "$out/repo" diff base "$id" >"$diff"
    for cfg in "${configs[@]}"; do
      start=$SECONDS
      MOONCAKE_PATCH=$diff PXN_CHECKS=$checks nice -n 10 "$root/hack/mooncake.sh" build "$cfg" </dev/null ||
        die "commit $n/$total ${id:0:12} ($subject): building $cfg failed"
      dir=$(MOONCAKE_PATCH=$diff "$root/hack/mooncake.sh" dir "$cfg")
      passed=0
      for prog in "${programs[@]}"; do
        run_program "$dir/tests/$prog" || die "commit $n/$total ${id:0:12} ($subject), $cfg: $prog failed"
        passed=$((passed + 1))
      done
      for prog in $checks; do
        run_program "$dir/src/transport/pxn_transport/$prog" || die "commit $n/$total ${id:0:12} ($subject), $cfg: $prog failed"
        passed=$((passed + 1))
      done
      echo "commit $n/$total ${id:0:12} [$stage] $subject: $cfg built and $passed test programs passed ($((SECONDS - start)) s)"
    done
  done <"$out/commits"
  echo "series: all $total commits build and pass in ${configs[*]}"
}

cmd=${1:-}
out=$(realpath -m "${2:-$root/_output/mooncake-series}")
case $cmd in
  generate)
    generate "$out"
    cat "$out/commits"
    ;;
  check)
    command -v git >/dev/null 2>&1 || die "git not found"
    generate "$out"
    log "series made in $out: $(wc -l <"$out/commits") commits"
    check "$out"
    ;;
  *) die "usage: $0 generate [OUT] | check [OUT]" ;;
esac
