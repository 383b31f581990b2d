#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A local demo of PXN on an embedded default: the rails of a bundled 8-GPU
# node, then eight ranks (one per simulated GPU and HCA) writing cross-rail
# through each other's staging rings on this machine's host path, with the
# live registry shown while they run. Needs only Go and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."

fixture=${PXN_DEMO_FIXTURE:-pkg/rail/testdata/sysfs/hgx-8gpu}
bytes=${PXN_DEMO_BYTES:-256MiB}
block=${PXN_DEMO_BLOCK:-16KiB}
bin=$(mktemp -d "${TMPDIR:-/tmp}/pxn-demo.XXXXXX")
trap 'rm -rf "$bin"' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building pxn-agent and pxn-bench"
CGO_ENABLED=1 go build -o "$bin/" ./cmd/pxn-agent ./cmd/pxn-bench

step "Rails of the bundled 8-GPU node ($fixture): pxn-agent discover"
"$bin/pxn-agent" discover --host-root "$fixture"

step "MC_PXN_RAIL_MAP the device plugin would hand to a pod on that node"
"$bin/pxn-agent" discover --host-root "$fixture" -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["railMap"], sort_keys=True, separators=(",",":")))' 2>/dev/null \
  || "$bin/pxn-agent" discover --host-root "$fixture" -o json

step "Eight ranks writing ${bytes} each to the next rail's remote buffer in ${block} blocks"
echo "Rank r stands for GPU r: its NIC (mlx5_r here) is on rail r, as in the table above."
echo "Every write goes to a remote buffer on rail r+1, so rank r stages its pieces in"
echo "rank r+1's ring, and rank r+1 forwards them on its own rail."
root=/dev/shm
[ -d "$root" ] || root=${TMPDIR:-/tmp}
(
  # Show the live registry once the ranks are up.
  for _ in $(seq 1 300); do
    dir=$(ls -d "$root"/pxn-bench-registry-*/mooncake-pxn-*-bench-pxn 2>/dev/null | head -1 || true)
    if [ -n "$dir" ] && [ "$(ls "$dir" | grep -c '^rank-' || true)" -ge 8 ]; then
      sleep 0.5
      echo
      echo "--- pxn-agent inspect (live, while the ranks run) ---"
      "$bin/pxn-agent" inspect --root "$(dirname "$dir")" 2>&1 | head -60 || true
      echo "--- end of inspect ---"
      break
    fi
    sleep 0.1
  done
) &
watcher=$!
"$bin/pxn-bench" run --device host --ranks 8 --bytes "$bytes" --block "$block" --pattern cross-rail
wait "$watcher" 2>/dev/null || true

step "Done"
echo "Every destination byte was checked by the target processes (VERIFIED column)."
