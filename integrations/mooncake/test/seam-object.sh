#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compiles the link seam (test/rdma_seam.cpp, the project's emulated NIC in
# place of Mooncake's RdmaTransport) exactly as a Mooncake build compiled
# rdma_transport.cpp: that file's command from the build's
# compile_commands.json, in its folder, with the seam as the source and OBJ
# as the output, so the seam sees the configuration's definitions.
#
#   integrations/mooncake/test/seam-object.sh BUILD OBJ
#
# BUILD is a CMake build folder of Mooncake's engine (hack/mooncake.sh: an
# engine, module or shared build). Used by module-seam.sh and hack/nixl.sh.
set -euo pipefail

die() { echo "seam-object: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 BUILD OBJ"
db=$1/compile_commands.json
[ -f "$db" ] || die "no $db"
here=$(cd "$(dirname "$0")" && pwd)
obj=$(realpath -m "$2")
python=${PYTHON:-/usr/bin/python3}

# The folder and the command of rdma_transport.cpp, with the seam in its place.
mapfile -t found < <("$python" - "$db" "$here/rdma_seam.cpp" "$obj" <<'PY'
import json, shlex, sys
db, src, obj = sys.argv[1:]
for e in json.load(open(db)):
    if e["file"].endswith("/src/transport/rdma_transport/rdma_transport.cpp"):
        args = shlex.split(e["command"])
        args[args.index("-o") + 1] = obj
        args[args.index("-c") + 1] = src
        print(e["directory"])
        print(shlex.join(args))
        break
else:
    sys.exit("compile_commands.json has no rdma_transport.cpp")
PY
)
[ ${#found[@]} -eq 2 ] || die "no compile command for rdma_transport.cpp in $db"
(cd "${found[0]}" && eval "${found[1]} -I$here") || die "compiling the seam failed"
