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
# Several ranks on one GPU time-slice it unless they share it through MPS,
# so run starts an MPS control daemon of its own (pipe and log folders
# under OUT/mps; it changes no GPU setting), runs every step after the
# first under it and tells the daemon to quit at the end, also when a step
# fails or the kit is interrupted. Without nvidia-cuda-mps-control it says
# so and runs every step without MPS. OUT/steps.txt has one line a step:
# its exit status (124: out of time), its time and whether MPS was on.
# GPU_KIT_ONLY, a list of step names, runs those steps alone;
# GPU_KIT_GATHER_PTX, a PTX file, is the gather kernel of the after steps.
#
# Steps, most wanted first (each one's limit in seconds; the kit as a whole
# stops starting steps once GPU_KIT_BUDGET seconds, 560 by default, are
# spent, and cuts the last one's limit to what is left):
#   nomps-p3 (40)     pxn-bench --suite p3 without MPS: the time-sliced
#                     contrast (before the daemon starts)
#   after-p13 (110)   --suite p1,p3: P1, cross-rail 1→1 against the NIC
#                     alone (P13), P3 with per-sender fan-in rows, P4, P5
#                     (pump CPU, wake-ups, idle, after idle), P6
#   before-p13 (90)   the same with the baseline's pxn-bench, if built
#   after-p10 (50)    --suite p10: kv-small completion, and the same
#                     bytes in two blocks and 128 KiB in two (its parts)
#   noparts-p10 (50)  the same with --slot-parts 1: each Piece copied
#                     whole before its relay forwards any of it
#   noinline-p10 (50) the same with --no-inline-plan: every gather plan
#                     uploaded before its launch
#   spin-p10 (50)     the same with --poll-spin 2ms: pumps that never nap
#                     while a request moves
#   before-p10 (30)   --suite p10 with the baseline's pxn-bench
#   after-p14 (120)   --suite p14-1to1: P14 1→1, KV requests of 1, 2, 4,
#                     8, 16, 18 and 64 KiB blocks, one request of several
#                     block sizes, and streams of one-block requests, at
#                     R = 50 against direct (GPU_KIT_P14_LIMIT replaces
#                     the limit, for a call of its own with GPU_KIT_ONLY)
#   before-p14 (90)   the baseline's pxn-bench, which has no p14 suite, on
#                     P14's KV 1→1 at every size, one run each (the kit's
#                     own baseline-p14 command), if built
#   after-p14kv (90)  this build on the same P14 1→1 rows as before-p14
#                     (for calls that alternate the two)
#   after-p8 (60)     --suite p8: same-rail 4 KiB, 64 KiB and 8 MiB
#                     requests through the engine against the uncapped
#                     NIC alone
#   after-p9 (170)    --suite p9: kv-medium and kv-large, 1→1, 7→1 and
#                     all-to-all (each scenario's rows written as it ends)
#   after-p14-7to1 (160)  --suite p14-7to1: P14 7→1 at every size, KV
#                     requests then streams
#   after-p14-a2a (170)   --suite p14-a2a: P14 all-to-all over 8 ranks at
#                     every size, KV requests then streams
#   pidns (35)        2 ranks each in PID and mount namespaces of its own,
#                     only where pxn-bench run --help lists --pidns (root)
#   cuda (20)         pkg/cuda's tests (the driver's bindings: pointer
#                     classification, streams, events, VMM)
#   gpu (40)          pkg/gpu's tests
#   libpxn (45)       the C ABI's GPU tests (gpu_ranks.c, compiled there)
#   nic (25)          the emulated NIC alone (internal/sim/gpunic benchmarks)
#   firsthop (150)    hack/cuda-probe/firsthop.cu, compiled there with nvcc
#                     (NVCC names another; none found: the step is skipped):
#                     the ways to start a first hop (a launch a slot, a
#                     graph, a resident kernel) with 1 and 8 processes, and
#                     a resident kernel's idle cost (docs/cuda.md)
set -euo pipefail

# The P14 1→1 KV requests that the baseline runs: internal/bench's
# p14Shape of every block size, p14Requests and p14Inflight (a test there
# keeps them equal), so both columns move the same traffic.
p14_shapes="80x256x1KiB 80x128x2KiB 80x64x4KiB 80x32x8KiB 80x16x16KiB 80x14x18KiB 80x4x64KiB"
p14_requests=16
p14_inflight=4

# kit_p14_kv BENCH OUT NAME [ARGS...] runs BENCH (a pxn-bench) on each P14
# 1→1 shape, one JSON file a shape in OUT (NAME-p14-SHAPE.json), ARGS added
# to each run; a run that fails does not stop the next.
kit_p14_kv() {
  local bench=$1 out=$2 name=$3 s
  shift 3
  cd "$(dirname "$0")"
  for s in $p14_shapes; do
    echo "gpu-kit: $name, P14 1→1 $s"
    "./$bench" run --device cuda --ranks 2 --pattern kv --kv-shape "$s" --kv-requests "$p14_requests" \
      --kv-inflight "$p14_inflight" --rate 50 "$@" --json "$out/$name-p14-$s.json" || echo "gpu-kit: $s exited $?"
  done
}

kit_build() {
  cd "$(dirname "$0")/.."
  local root out
  root=$(pwd -P)
  out=$root/_output/gpu-kit
  rm -rf "$out"
  mkdir -p "$out/lib"
  export CGO_ENABLED=1
  go build -o "$out/pxn-bench" ./cmd/pxn-bench
  go test -c -o "$out/gpunic.test" ./internal/sim/gpunic
  go test -c -o "$out/libpxn.test" ./cmd/libpxn
  go test -c -o "$out/gpu.test" ./pkg/gpu
  go test -c -o "$out/cuda.test" ./pkg/cuda
  go build -buildmode=c-shared -o "$out/lib/libpxn.so" ./cmd/libpxn
  if [ $# -gt 0 ] && [ -n "$1" ]; then
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

# The MPS control daemon of a run: its folders, whether it is up, and the
# empty pipe folder that keeps a step away from any daemon.
mps_pipes=""
mps_logs=""
mps_up=0
mps_scratch=""
no_mps_pipes=""

# mps_start starts a control daemon with private folders. A unix socket's
# path is limited to 108 bytes, so when OUT's path is long the pipes go to
# a private folder under /tmp instead (removed at the end).
mps_start() {
  local out=$1
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "gpu-kit: no nvidia-cuda-mps-control here; every step runs without MPS" | tee -a "$out/steps.txt" >&2
    return 0
  fi
  mps_logs=$out/mps/log
  mps_pipes=$out/mps/pipe
  if [ ${#mps_pipes} -gt 60 ]; then
    mps_scratch=$(mktemp -d /tmp/pxn-mps.XXXXXX)
    mps_pipes=$mps_scratch/pipe
  fi
  mkdir -p "$mps_pipes" "$mps_logs"
  if CUDA_MPS_PIPE_DIRECTORY=$mps_pipes CUDA_MPS_LOG_DIRECTORY=$mps_logs nvidia-cuda-mps-control -d; then
    mps_up=1
    export CUDA_MPS_PIPE_DIRECTORY=$mps_pipes CUDA_MPS_LOG_DIRECTORY=$mps_logs
    echo "gpu-kit: MPS control daemon up (pipes in $mps_pipes, logs in $mps_logs)" | tee -a "$out/steps.txt" >&2
  else
    echo "gpu-kit: the MPS control daemon did not start; the steps run without MPS" | tee -a "$out/steps.txt" >&2
  fi
}

# mps_stop tells the daemon to quit (it stops its server first) and waits
# a little for its pipes to go. It runs once, from the exit trap.
mps_stop() {
  if [ "$mps_up" = 1 ]; then
    mps_up=0
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_pipes CUDA_MPS_LOG_DIRECTORY=$mps_logs nvidia-cuda-mps-control >/dev/null 2>&1 || true
    local i
    for i in $(seq 50); do
      [ -e "$mps_pipes/control" ] || break
      sleep 0.2
    done
  fi
  [ -z "$mps_scratch" ] || rm -rf "$mps_scratch"
  [ -z "$no_mps_pipes" ] || rm -rf "$no_mps_pipes"
}

# on_signal stops the step in progress (timeout passes the signal on to
# the step's processes) and leaves through the exit trap.
step_pid=""
on_signal() {
  [ -z "$step_pid" ] || kill -TERM "$step_pid" 2>/dev/null || true
  exit 130
}

kit_run() {
  local out=$1 kit repo budget started
  kit=$(cd "$(dirname "$0")" && pwd -P)
  repo=${PXN_REPO:-$(cd "$kit/../.." && pwd -P)}
  budget=${GPU_KIT_BUDGET:-560}
  [ -f "$repo/include/pxn.h" ] ||
    { echo "gpu-kit: $repo is not a checkout (the C test compiles its include/ and testdata/); set PXN_REPO" >&2; exit 1; }
  mkdir -p "$out"
  out=$(cd "$out" && pwd -P)
  cd "$kit"
  : > "$out/steps.txt"
  {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
    echo "cpus $(nproc); kit commit $(cat COMMIT); baseline $(cat BASELINE 2>/dev/null || echo none)"
  } > "$out/machine.txt" 2>&1 || true
  trap mps_stop EXIT
  trap on_signal INT TERM
  started=$(date +%s)
  # GPU_KIT_GATHER_PTX: the after steps load the gather kernel from this
  # PTX file instead of the one built in (a kernel regenerated there).
  local ptx=()
  [ -z "${GPU_KIT_GATHER_PTX:-}" ] || ptx=(--gather-ptx "$(realpath "$GPU_KIT_GATHER_PTX")")
  # step NAME LIMIT CMD...: runs CMD (in STEP_DIR, if set) with its output
  # in OUT/NAME.txt, within LIMIT seconds and what is left of the budget.
  # It runs in the background and is waited for, so that a signal to the
  # kit is handled at once: the step is stopped and the daemon told to quit.
  step() {
    local name=$1 limit=$2 left start rc mps=off
    shift 2
    if [ -n "${GPU_KIT_ONLY:-}" ] && [[ " $GPU_KIT_ONLY " != *" $name "* ]]; then
      echo "$name skipped: not in GPU_KIT_ONLY" | tee -a "$out/steps.txt"
      return 0
    fi
    left=$((budget - ($(date +%s) - started)))
    if [ "$left" -lt 10 ]; then
      echo "$name skipped: ${left}s of the ${budget}s budget left" | tee -a "$out/steps.txt"
      return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
    [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || [ "$CUDA_MPS_PIPE_DIRECTORY" = "$no_mps_pipes" ] || mps=on
    start=$(date +%s%N)
    (cd "${STEP_DIR:-.}" && exec timeout --kill-after=5 "$limit" "$@") > "$out/$name.txt" 2>&1 &
    step_pid=$!
    set +e
    wait "$step_pid"
    rc=$?
    set -e
    step_pid=""
    echo "$name rc=$rc $((($(date +%s%N) - start) / 1000000)) ms limit=${limit}s mps=$mps" | tee -a "$out/steps.txt"
  }

  # The contrast without MPS, before any daemon of ours runs: the ranks
  # look for one in an empty folder of their own and find none.
  no_mps_pipes=$(mktemp -d /tmp/pxn-nomps.XXXXXX)
  CUDA_MPS_PIPE_DIRECTORY=$no_mps_pipes step nomps-p3 40 ./pxn-bench run --device cuda --suite p3 --json "$out/nomps-p3.json"

  mps_start "$out"
  step after-p13 110 ./pxn-bench run --device cuda --suite p1,p3 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p13.json"
  if [ -x pxn-bench.before ]; then
    step before-p13 90 ./pxn-bench.before run --device cuda --suite p1,p3 --json "$out/before-p13.json"
  fi
  step after-p10 50 ./pxn-bench run --device cuda --suite p10 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p10.json"
  step noparts-p10 50 ./pxn-bench run --device cuda --suite p10 --slot-parts 1 --json "$out/noparts-p10.json"
  step noinline-p10 50 ./pxn-bench run --device cuda --suite p10 --no-inline-plan --json "$out/noinline-p10.json"
  step spin-p10 50 ./pxn-bench run --device cuda --suite p10 --poll-spin 2ms --json "$out/spin-p10.json"
  if [ -x pxn-bench.before ]; then
    step before-p10 30 ./pxn-bench.before run --device cuda --suite p10 --json "$out/before-p10.json"
  fi
  step after-p14 "${GPU_KIT_P14_LIMIT:-120}" ./pxn-bench run --device cuda --suite p14-1to1 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p14.json"
  if [ -x pxn-bench.before ]; then
    step before-p14 90 "$kit/gpu-kit.sh" baseline-p14 "$out"
    # The same rows with this build, right after, for a call that
    # alternates the two (GPU_KIT_ONLY="before-p14 after-p14kv", repeated).
    step after-p14kv 90 "$kit/gpu-kit.sh" after-p14kv "$out" ${ptx[@]+"${ptx[@]}"}
  fi
  step after-p8 60 ./pxn-bench run --device cuda --suite p8 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p8.json"
  step after-p9 170 ./pxn-bench run --device cuda --suite p9 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p9.json"
  # P14's other traffic, each a step of its own: the suite's 30 scenarios
  # of 2–64 KiB took 224 s on one H100 under MPS (106a924): 1→1 38 s of
  # them, 7→1 86 s and all-to-all 100 s; seven sizes and the request of
  # several sizes make that about 60, 125 and 140 s.
  step after-p14-7to1 160 ./pxn-bench run --device cuda --suite p14-7to1 ${ptx[@]+"${ptx[@]}"} --json "$out/after-p14-7to1.json"
  step after-p14-a2a 170 ./pxn-bench run --device cuda --suite p14-a2a ${ptx[@]+"${ptx[@]}"} --json "$out/after-p14-a2a.json"
  local help
  help=$(./pxn-bench run --help 2>&1 || true)
  if grep -q -- '--pidns' <<<"$help"; then
    local share=()
    ! grep -q -- '--arena-share' <<<"$help" || share=(--arena-share fd)
    step pidns 35 ./pxn-bench run --device cuda --ranks 2 --pattern cross-rail --bytes 256MiB --block 8MiB --pidns ${share[@]+"${share[@]}"} --json "$out/pidns.json"
  else
    echo "pidns skipped: this pxn-bench has no --pidns" | tee -a "$out/steps.txt"
  fi
  step cuda 20 ./cuda.test -test.v
  step gpu 40 ./gpu.test -test.v
  STEP_DIR=$repo/cmd/libpxn PXN_LIBPXN_DIR=$kit/lib step libpxn 45 "$kit/libpxn.test" -test.v -test.run 'TestGPURanksThroughCABI|TestFirstHopChoice|TestABIRules'
  PXN_REQUIRE_GPU=1 step nic 25 ./gpunic.test -test.run '^$' -test.bench . -test.benchtime 200ms
  local nvcc=${NVCC:-nvcc}
  if command -v "$nvcc" >/dev/null 2>&1; then
    step firsthop 150 bash -c '"$3" -O3 -std=c++17 -arch=sm_90 -o "$1/firsthop" "$2/hack/cuda-probe/firsthop.cu" -lcuda && "$1/firsthop" 1 8' _ "$out" "$repo" "$nvcc"
  else
    echo "firsthop skipped: no nvcc here" | tee -a "$out/steps.txt"
  fi
}

case ${1:-} in
  build) shift; kit_build "$@" ;;
  run) [ $# -eq 2 ] || { echo "usage: gpu-kit.sh run OUT" >&2; exit 2; }; kit_run "$2" ;;
  baseline-p14) [ $# -eq 2 ] || { echo "usage: gpu-kit.sh baseline-p14 OUT" >&2; exit 2; }; kit_p14_kv pxn-bench.before "$2" before ;;
  after-p14kv) [ $# -ge 2 ] || { echo "usage: gpu-kit.sh after-p14kv OUT [PXN-BENCH ARGS]" >&2; exit 2; }; out=$2; shift 2; kit_p14_kv pxn-bench "$out" after "$@" ;;
  *) sed -n '3,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
