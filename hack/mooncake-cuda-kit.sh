#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs a kit for building Mooncake's Python module with PXN's transport and
# USE_CUDA=ON on a machine that has CMake, a C++ compiler, nvcc and Python
# (with its headers) but none of Mooncake's Debian packages and no network:
# the patched Mooncake tree, PXN's transport and wheel files, libpxn.so, and
# Mooncake's dependencies as Debian packages extracted (dpkg -x) into one
# folder, with kit-build.sh, the recipe that runs there
# (docs/integration-mooncake.md, "A CUDA build on a machine without
# Mooncake's packages").
#
#   hack/mooncake-cuda-kit.sh [OUT]    OUT default _output/mooncake-cuda-kit
#
# Needs apt-get (the packages are downloaded here, by name) and LIBPXN, the
# libpxn.so to ship (make mooncake-cuda-kit builds it). MOONCAKE_TREE: as
# hack/mooncake.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/_output/mooncake-cuda-kit}
limit_mib=60

die() { echo "mooncake-cuda-kit: $*" >&2; exit 1; }

# Mooncake's build and link dependencies (hack/host-packages.sh's mooncake
# list less the compilers, Python and gtest), and what they need at run time
# beyond a base system.
PACKAGES=(
  libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2
  libunwind-dev libunwind8
  libjsoncpp-dev libjsoncpp25 libyaml-cpp-dev libyaml-cpp0.7
  libibverbs-dev libibverbs1 ibverbs-providers libnl-3-dev libnl-3-200
  libnl-route-3-dev libnl-route-3-200 libnuma-dev libnuma1
)

[ -n "${LIBPXN:-}" ] && [ -f "$LIBPXN" ] || die "LIBPXN=${LIBPXN:-} is no file: the libpxn.so to ship"
for tool in apt-get dpkg patch; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
src=$("$root/hack/mooncake.sh" tree) || die "no Mooncake tree (see hack/mooncake.sh)"
commit=$("$root/hack/mooncake.sh" commit)
[ -d "$src/mooncake-integration/transfer_engine" ] || die "the Mooncake tree $src has no mooncake-integration"

rm -rf "$out"
mkdir -p "$out/debs" "$out/deps" "$out/pxn/integrations/mooncake"
cp -R "$src" "$out/mooncake"
chmod -R u+w "$out/mooncake"
patch -p1 --quiet --forward -d "$out/mooncake" <"$root/integrations/mooncake/patches/mooncake.patch" ||
  die "the patch does not apply to $src"
cp -R "$root/include" "$out/pxn/"
cp -R "$root/integrations/mooncake/src" "$root/integrations/mooncake/cmake" "$root/integrations/mooncake/wheel" \
  "$out/pxn/integrations/mooncake/"
cp "$root/VERSION" "$root/LICENSE" "$out/pxn/"
cp "$LIBPXN" "$out/libpxn.so"
cp "$root/integrations/mooncake/kit-build.sh" "$out/kit-build.sh"
chmod +x "$out/kit-build.sh"

(cd "$out/debs" && apt-get download "${PACKAGES[@]}" >/dev/null) || die "apt-get download ${PACKAGES[*]} failed"
for deb in "$out"/debs/*.deb; do
  dpkg -x "$deb" "$out/deps"
done
{
  echo "mooncake $commit"
  echo "pxn $(cat "$root/VERSION") $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  (cd "$out/debs" && ls *.deb)
} >"$out/MANIFEST"
rm -rf "$out/debs" "$out/deps/usr/share/doc" "$out/deps/usr/share/man"

size=$(du -sm "$out" | cut -f1)
[ "$size" -lt "$limit_mib" ] || die "the kit is $size MiB, over $limit_mib MiB"
echo "$out ($size MiB)"
