#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# P15 (docs/benchmarks.md): Mooncake's batch_transfer_sync_write of 256
# blocks of 4 KiB, PXN on against off, through the module linked against
# the link seam. Takes the default configuration's wheel (make
# mooncake-wheel), links its module against the seam
# (integrations/mooncake/test/module-seam.sh), installs both into a virtual
# environment, builds pxn-agent and runs
# integrations/mooncake/python/bench_p15.py there; arguments go to it.
#
#   hack/mooncake-p15.sh [--rounds N] [--calls N] ...
#
# P15_DIR: the work folder (default _output/p15). MOONCAKE_TREE,
# PXN_TOOLS_DIR: as hack/mooncake.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${P15_DIR:-$root/_output/p15}
python=${PYTHON:-/usr/bin/python3}
cd "$root"
mkdir -p "$out"

build=$(hack/mooncake.sh module-dir default)
whl=$(hack/mooncake-wheel.sh path default)
module=$(integrations/mooncake/test/module-seam.sh "$build" "$out/module")
rm -rf "$out/venv"
PYTHON=$python hack/mooncake-wheel.sh install "$whl" "$out/venv" >/dev/null
site=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$module" "$site/mooncake/"
go build -o "$out/pxn-agent" ./cmd/pxn-agent

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit+=" with uncommitted changes"
cd integrations/mooncake/python
PXN_AGENT=$out/pxn-agent PYTHONDONTWRITEBYTECODE=1 "$out/venv/bin/python" bench_p15.py --commit "$commit" "$@"
