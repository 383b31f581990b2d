#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds PXN's binaries, stamped with the VERSION file's release, and packs
# them into the pxn image, plus a pause image, without a container engine.
#
#   hack/image/build.sh [OUTDIR]        default OUTDIR: _output/images
#
# One platform (the default, this machine's): OUTDIR/pxn.tar, which loads with
#   ctr -n k8s.io images import OUTDIR/pxn.tar
# Several, PLATFORMS=linux/amd64,linux/arm64: OUTDIR/pxn.oci.tar, one OCI image
# index holding an image per platform (checked: every binary's ELF machine is
# its platform's), and OUTDIR/pxn-<arch>.tar for each. The binaries use cgo; an
# arm64 image on an amd64 machine is cross-compiled with Debian's
# gcc-aarch64-linux-gnu, against its arm64 C library, whose loader and
# libraries go into the image (hack/host-packages.sh installs them when
# missing).
#
# IMAGE (default pxn:<VERSION>), PAUSE_IMAGE (default pause:3.10), FORMAT
# (docker or oci, default docker; several platforms are always oci) and
# LIBPXN=1 (also build libpxn.so into /usr/local/lib; default: only when
# several platforms are built, or pack a libpxn.so found at the repository
# root) override the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-_output/images}
version=$(cat VERSION)
image=${IMAGE:-pxn:$version}
pause_image=${PAUSE_IMAGE:-pause:3.10}
format=${FORMAT:-docker}
host_arch=$(go env GOARCH)
platforms=${PLATFORMS:-linux/$host_arch}
IFS=, read -r -a plats <<<"$platforms"
multi=0
[ ${#plats[@]} -gt 1 ] && multi=1 && format=oci
libpxn=${LIBPXN:-$multi}

pkg=github.com/pxn-project/pxn/internal/version
revision=$(git rev-parse HEAD 2>/dev/null || true)
ldflags="-s -w -X $pkg.version=$version${revision:+ -X $pkg.revision=$revision}"

# cc_for ARCH: the C compiler that builds cgo code for ARCH here.
cc_for() {
  case $1 in
    "$host_arch") echo "${CC:-gcc}" ;;
    arm64)
      command -v aarch64-linux-gnu-gcc >/dev/null || bash hack/host-packages.sh install cross >&2
      echo aarch64-linux-gnu-gcc
      ;;
    *) echo "image: no cross C compiler known for $1 (on $host_arch)" >&2; return 1 ;;
  esac
}

sysroot_for() {
  case $1 in
    "$host_arch") ;;
    arm64) echo /usr/aarch64-linux-gnu ;;
  esac
}

mkdir -p "$out"
parts=()
for plat in "${plats[@]}"; do
  os=${plat%%/*} arch=${plat#*/}
  [ "$os" = linux ] || { echo "image: platform $plat: only linux images" >&2; exit 2; }
  cc=$(cc_for "$arch")
  bin=$out/bin-$arch
  [ "$multi" = 1 ] || bin=$out/bin
  rm -rf "$bin"
  mkdir -p "$bin"
  echo "image: building for linux/$arch (CC=$cc)" >&2
  CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc go build -trimpath -ldflags "$ldflags" -o "$bin/" \
    ./cmd/pxn-agent ./cmd/pxn-device-plugin ./cmd/pxn-dra-plugin ./cmd/pxn-bench ./cmd/pxn-gpucheck
  adds=()
  for f in "$bin"/*; do
    adds+=(-add "$f:/usr/local/bin/$(basename "$f"):0755")
  done
  if [ "$libpxn" = 1 ]; then
    CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc go build -trimpath -buildmode=c-shared -ldflags "$ldflags" \
      -o "$bin/lib/libpxn.so" ./cmd/libpxn
    adds+=(-add "$bin/lib/libpxn.so:/usr/local/lib/libpxn.so:0755")
  elif [ -f libpxn.so ] && [ "$arch" = "$host_arch" ]; then
    adds+=(-add "libpxn.so:/usr/local/lib/libpxn.so:0755")
  fi
  sysroot=$(sysroot_for "$arch")
  target=$out/pxn.tar
  [ "$multi" = 1 ] && target=$out/pxn-$arch.tar
  go run ./hack/image -o "$target" -name "$image" -format "$format" -arch "$arch" -ldd ${sysroot:+-sysroot "$sysroot"} "${adds[@]}" \
    -env PATH=/usr/local/bin:/usr/bin:/bin -env LD_LIBRARY_PATH=/usr/local/lib \
    -label "org.opencontainers.image.version=$version" ${revision:+-label "org.opencontainers.image.revision=$revision"} \
    -entrypoint /usr/local/bin/pxn-agent
  parts+=("$target")
done
if [ "$multi" = 1 ]; then
  go run ./hack/image -index -o "$out/pxn.oci.tar" -name "$image" "${parts[@]}"
  go run ./hack/image -verify "$out/pxn.oci.tar"
fi
go run ./hack/image -o "$out/pause.tar" -name "$pause_image" -format "$format" -pause
