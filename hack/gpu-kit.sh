#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every GPU figure of docs/benchmarks.md in one bounded run, for a GPU
# machine that has the CUDA driver and gcc but no Go toolchain.
#
#   hack/gpu-kit.sh build [BASELINE]   on the build machine: binaries of this
#                                      tree (and pxn-bench of BASELINE, a
#                                      commit, for before/after rows) into
#                                      _output/gpu-kit/
#   _output/gpu-kit/gpu-kit.sh run OUT on the GPU machine, the kit inside a
#                                      checkout of the same commit (or
#                                      PXN_REPO naming one): every step
#                                      bounded, outputs and a step log in OUT
#
# Steps, most wanted first (each one's time limit in seconds):
#   after-p13 (110)   pxn-bench --suite p1,p3: P1, P3 with per-sender fan-in
#                     rows, P4, P5 (pump CPU, wake-ups, idle, after idle), P6
#   before-p13 (110)  the same with the baseline's pxn-bench, if built
#   after-p10 (70), after-p9 (200)   the KV suites
#   nic (45)          the emulated NIC alone (pkg/sim/gpunic benchmarks)
#   libpxn (60)       the C ABI's GPU tests (gpu_ranks.c, compiled there)
#   gpu (40)          pkg/gpu's tests
#   after-p13-spin (100)   P1/P3 with a pump that never sleeps while busy:
#                     the CPU side of the trade-off
set -euo pipefail

kit_build() {
  cd "$(dirname "$0")/.."
  local root out
  root=$(pwd -P)
  out=$root/_output/gpu-kit
  rm -rf "$out"
  mkdir -p "$out/lib"
  export CGO_ENABLED=1
  go build -o "$out/pxn-bench" ./cmd/pxn-bench
  go test -c -o "$out/gpunic.test" ./pkg/sim/gpunic
  go test -c -o "$out/libpxn.test" ./cmd/libpxn
  go test -c -o "$out/gpu.test" ./pkg/gpu
  go build -buildmode=c-shared -o "$out/lib/libpxn.so" ./cmd/libpxn
  if [ $# -gt 0 ]; then
    local base wt
    base=$(git rev-parse --verify --quiet "${1}^{commit}") ||
      { echo "gpu-kit: baseline $1 is not a commit of this repository" >&2; exit 1; }
    wt=$root/_output/gpu-kit-baseline
    git worktree prune
    git worktree list --porcelain | grep -qxF "worktree $wt" && git worktree remove --force "$wt"
    git worktree add --detach "$wt" "$base" >/dev/null
    (cd "$wt" && go build -o "$out/pxn-bench.before" ./cmd/pxn-bench)
    git worktree remove --force "$wt"
    echo "$base" > "$out/BASELINE"
  fi
  git rev-parse HEAD > "$out/COMMIT"
  cp "$root/hack/gpu-kit.sh" "$out/gpu-kit.sh"
  du -sh "$out"
}

kit_run() {
  local out=$1 kit repo
  kit=$(cd "$(dirname "$0")" && pwd -P)
  repo=${PXN_REPO:-$(cd "$kit/../.." && pwd -P)}
  [ -f "$repo/include/pxn.h" ] ||
    { echo "gpu-kit: $repo is not a checkout (the C test compiles its include/ and testdata/); set PXN_REPO" >&2; exit 1; }
  mkdir -p "$out"
  out=$(cd "$out" && pwd -P)
  cd "$kit"
  {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "cpus $(nproc); kit commit $(cat COMMIT); baseline $(cat BASELINE 2>/dev/null || echo none)"
  } > "$out/machine.txt" 2>&1 || true
  step() {
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s%N)
    set +e
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    set -e
    echo "$name rc=$rc $((($(date +%s%N) - start) / 1000000)) ms" | tee -a "$out/steps.txt"
  }
  step after-p13 110 ./pxn-bench run --device cuda --suite p1,p3 --json "$out/after-p13.json"
  if [ -x pxn-bench.before ]; then
    step before-p13 110 ./pxn-bench.before run --device cuda --suite p1,p3 --json "$out/before-p13.json"
  fi
  step after-p10 70 ./pxn-bench run --device cuda --suite p10 --json "$out/after-p10.json"
  step after-p9 200 ./pxn-bench run --device cuda --suite p9 --json "$out/after-p9.json"
  PXN_REQUIRE_GPU=1 step nic 45 ./gpunic.test -test.run '^$' -test.bench . -test.benchtime 3000x
  (cd "$repo/cmd/libpxn" && PXN_LIBPXN_DIR=$kit/lib step libpxn 60 "$kit/libpxn.test" -test.v -test.run 'TestGPURanksThroughCABI|TestFirstHopChoice|TestABIRules')
  step gpu 40 ./gpu.test -test.v
  step after-p13-spin 100 ./pxn-bench run --device cuda --suite p1,p3 --poll-nap -1ns --json "$out/after-p13-spin.json"
}

case ${1:-} in
  build) shift; kit_build "$@" ;;
  run) [ $# -eq 2 ] || { echo "usage: gpu-kit.sh run OUT" >&2; exit 2; }; kit_run "$2" ;;
  *) sed -n '3,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
