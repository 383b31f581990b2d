#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Mooncake transport's libFuzzer targets (integrations/mooncake/fuzz):
# what the transport reads from outside its code, fuzzed with clang++'s
# libFuzzer. hack/fuzz.sh and test/fuzz both run them through here.
#
#   hack/fuzz-mooncake.sh targets              print the targets, one a line
#   hack/fuzz-mooncake.sh build OUT            build every target into OUT
#   hack/fuzz-mooncake.sh run OUT NAME FLAG... run OUT/fuzz_NAME with libFuzzer's
#                                              FLAGs (-runs=N, -max_total_time=S)
#                                              over a scratch corpus and the
#                                              checked-in seeds; a crash's input
#                                              is kept in OUT/NAME-crash-*
#
# Exit codes: 0 ok, 1 a build or a target failed, 2 usage, 3 no clang++ (or
# it cannot build with libFuzzer: hack/host-packages.sh install mooncake).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/integrations/mooncake/fuzz
clangxx=${CLANGXX:-clang++}

usage() {
  echo "usage: hack/fuzz-mooncake.sh targets | build OUT | run OUT NAME FLAG..." >&2
  exit 2
}

case ${1:-} in
  targets)
    for f in "$dir"/fuzz_*.cpp; do
      f=${f##*/fuzz_}
      echo "${f%.cpp}"
    done
    ;;
  build)
    [[ $# -eq 2 ]] || usage
    if ! command -v "$clangxx" >/dev/null 2>&1; then
      echo "fuzz-mooncake: no $clangxx on PATH (hack/host-packages.sh install mooncake)" >&2
      exit 3
    fi
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    echo 'extern "C" int LLVMFuzzerTestOneInput(const char *, unsigned long) { return 0; }' >"$probe/p.cpp"
    if ! "$clangxx" -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
      echo "fuzz-mooncake: $clangxx cannot link with libFuzzer: $(head -c 400 "$probe/err")" >&2
      exit 3
    fi
    mkdir -p "$2"
    make -s -C "$dir" OUT="$(cd "$2" && pwd)" CLANGXX="$clangxx"
    ;;
  run)
    [[ $# -ge 3 ]] || usage
    out=$(cd "$2" && pwd)
    name=$3
    shift 3
    [[ -x $out/fuzz_$name ]] || { echo "fuzz-mooncake: no target $out/fuzz_$name (build first)" >&2; exit 1; }
    seeds=$dir/corpus/$name
    [[ -d $seeds ]] || { echo "fuzz-mooncake: no seeds at $seeds" >&2; exit 1; }
    # libFuzzer adds new inputs to the first folder: a scratch one, so the
    # checked-in seeds stay as they are.
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    "$out/fuzz_$name" "$@" -artifact_prefix="$out/$name-" "$scratch" "$seeds"
    ;;
  *) usage ;;
esac
