#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The relay's second hop, per-op path against the Piece path, in one run:
# pxn_transport_test bench (a relay and a sender through the emulated NIC)
# once with MC_PXN_SUBMIT_PIECE=0 and once with it unset, each on a fresh
# registry and fresh target buffers under /dev/shm. DIR holds
# pxn_transport_test and libpxn.so (make MOONCAKE_SRC=... OUT=DIR test-bin);
# prints the "BENCH ..." lines.
set -euo pipefail
dir=$(cd "${1:?usage: run-bench.sh DIR}" && pwd)
export LD_LIBRARY_PATH=$dir:$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rc=0
for piece in 0 1; do
  scratch=$(mktemp -d /dev/shm/pxn-mooncake-XXXXXX)
  truncate -s 64M "$scratch/decode0" "$scratch/decode1"
  mkdir -m 700 "$scratch/registry"
  if [ "$piece" = 0 ]; then export MC_PXN_SUBMIT_PIECE=0; else unset MC_PXN_SUBMIT_PIECE; fi
  SEAM_DIR=$scratch MC_PXN_ENABLE=1 MC_PXN_GROUP_ID=mooncake-bench MC_PXN_REGISTRY_ROOT="$scratch/registry" \
  MC_PXN_RAIL_MAP='{"mlx5_0":"rail0","mlx5_1":"rail1"}' MC_PXN_FIRST_PIECE_KIB=8192 \
    "$dir/pxn_transport_test" bench 2>"$scratch/bench.err" | grep -E '^(BENCH|FAIL)' || { rc=1; tail -20 "$scratch/bench.err"; }
  rm -rf "$scratch"
done
exit $rc
