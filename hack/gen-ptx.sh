#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Generates pkg/gpu/kernel/gather.ptx from gather.cu with nvcc. Needs the CUDA
# toolkit (not a GPU). The flags are pinned so that the committed PTX comes
# out byte for byte; --check regenerates into a temporary file and compares.
#
#   hack/gen-ptx.sh           write pkg/gpu/kernel/gather.ptx
#   hack/gen-ptx.sh --check   exit 1 if the committed file differs
set -euo pipefail
cd "$(dirname "$0")/../pkg/gpu/kernel"

nvcc=${NVCC:-nvcc}
# The release whose output is committed; another nvcc writes other bytes.
want_release="13.0"
flags=(-ptx -arch=compute_90 -O3 -std=c++17)

if ! command -v "$nvcc" >/dev/null 2>&1; then
	echo "gen-ptx: $nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
	exit 2
fi
release=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
if [[ "$release" != "$want_release" ]]; then
	echo "gen-ptx: nvcc release $release, the committed PTX comes from $want_release: expect a diff" >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Relative names and no -lineinfo/-G: the PTX then holds no path.
"$nvcc" "${flags[@]}" -o "$tmp/gather.ptx" gather.cu

if [[ "${1:-}" == "--check" ]]; then
	if cmp -s gather.ptx "$tmp/gather.ptx"; then
		echo "gen-ptx: pkg/gpu/kernel/gather.ptx is up to date"
		exit 0
	fi
	echo "gen-ptx: pkg/gpu/kernel/gather.ptx differs from what nvcc $release generates:" >&2
	diff gather.ptx "$tmp/gather.ptx" | head -40 >&2 || true
	exit 1
fi
cp "$tmp/gather.ptx" gather.ptx
echo "gen-ptx: wrote pkg/gpu/kernel/gather.ptx ($(wc -c <gather.ptx) bytes, nvcc $release)"
