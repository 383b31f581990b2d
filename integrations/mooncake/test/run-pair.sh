#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the transport's test program outside go test: the PXN-off cases, then
# a relay and a sender sharing a fresh registry and target buffers under
# /dev/shm. DIR holds pxn_transport_test and libpxn.so, and in DIR/lib the
# shared libraries a machine without Mooncake's packages lacks (bundle.sh).
# On a GPU machine the sources are device memory and libpxn's copier is its
# CUDA one; PXN_TEST_CUDA=1 makes a missing GPU an error.
set -euo pipefail
dir=$(cd "${1:?usage: run-pair.sh DIR}" && pwd)
scratch=$(mktemp -d /dev/shm/pxn-mooncake-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
truncate -s 64M "$scratch/decode0" "$scratch/decode1"
mkdir -m 700 "$scratch/registry"
export SEAM_DIR=$scratch
export LD_LIBRARY_PATH=$dir:$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rc=0
env -u MC_PXN_ENABLE "$dir/pxn_transport_test" off 2>"$scratch/off.err" || { rc=1; tail -20 "$scratch/off.err"; }
MC_PXN_ENABLE=1 MC_PXN_GROUP_ID=mooncake-test MC_PXN_REGISTRY_ROOT="$scratch/registry" \
MC_PXN_RAIL_MAP='{"mlx5_0":"rail0","mlx5_1":"rail1"}' MC_PXN_CREDIT_TIMEOUT_MS=300 MC_PXN_FIRST_PIECE_KIB=8192 \
  "$dir/pxn_transport_test" pair 2>"$scratch/pair.err" || { rc=1; tail -40 "$scratch/pair.err"; }
grep -h "pxn first hop" "$scratch/pair.err" | head -2 || true
exit $rc
