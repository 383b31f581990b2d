#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the test program and libpxn.so into OUT, and copies into OUT/lib the
# shared libraries they load that are not glibc's, for a machine without
# Mooncake's packages. Run the bundle with run-pair.sh OUT.
set -euo pipefail
src=$(cd "${1:?usage: bundle.sh MOONCAKE_SRC OUT}" && pwd)
out=$(mkdir -p "${2:?usage: bundle.sh MOONCAKE_SRC OUT}" && cd "$2" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
make -C "$here" test-bin MOONCAKE_SRC="$src" OUT="$out/build" CXXFLAGS="-O2 -g"
cp "$out/build/pxn_transport_test" "$out/build/libpxn.so" "$out/"
cp "$here/test/run-pair.sh" "$out/"
mkdir -p "$out/lib"
LD_LIBRARY_PATH="$out" ldd "$out/pxn_transport_test" "$out/libpxn.so" |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
  grep -v "$out/" | xargs -r cp -L -t "$out/lib/"
rm -rf "$out/build"
ls -la "$out" "$out/lib"
