#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Links a test build of Mooncake's Python module mooncake.engine against the
# link seam: the module's objects and the engine's libraries as
# hack/mooncake.sh module built them in BUILD (hack/mooncake.sh module-dir
# CONFIG), with Mooncake's rdma_transport.cpp replaced by test/rdma_seam.cpp,
# compiled with that file's flags (so with the configuration's definitions).
# Everything else is Mooncake's own: TransferEngine, the P2P handshake,
# TransferMetadata, Topology, MultiTransport with PXN's transport.
#
#   integrations/mooncake/test/module-seam.sh BUILD OUT
#       OUT/engine.cpython-*.so   the module (RUNPATH $ORIGIN, like the wheel's)
#
# Nothing in BUILD is changed.
set -euo pipefail

die() { echo "module-seam: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 BUILD OUT"
build=$(cd "$1" && pwd) || die "no build folder $1"
mkdir -p "$2"
out=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)

[ -f "$build/.module-built" ] || die "$build holds no built module (hack/mooncake.sh module CONFIG)"
link=$build/mooncake-integration/CMakeFiles/engine.dir/link.txt
archive=$build/mooncake-transfer-engine/src/libtransfer_engine.a
for f in "$build/compile_commands.json" "$link" "$archive"; do
  [ -f "$f" ] || die "$build has no $f"
done

"$here/seam-object.sh" "$build" "$out/rdma_seam.o"

# The engine's library without Mooncake's RdmaTransport.
cp "$archive" "$out/libtransfer_engine.a"
ar d "$out/libtransfer_engine.a" rdma_transport.cpp.o

module=$(sed -n 's/.* -o \(engine[^ ]*\.so\) .*/\1/p' "$link")
[ -n "$module" ] || die "no module name in $link"
line=$(sed -e "s| -o $module | -o $out/$module $out/rdma_seam.o |" \
  -e "s|\.\./mooncake-transfer-engine/src/libtransfer_engine\.a|$out/libtransfer_engine.a|" "$link")
(cd "$build/mooncake-integration" && eval "$line")
echo "$out/$module"
