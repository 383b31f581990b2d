#!/usr/bin/env bash
# Builds PXN's binaries and packs them into the pxn image, plus a pause image,
# without a container engine. The archives load with
#   ctr -n k8s.io images import _output/images/pxn.tar
#
#   hack/image/build.sh [OUTDIR]        default OUTDIR: _output/images
#
# IMAGE (default pxn:<chart appVersion>), PAUSE_IMAGE (default pause:3.10) and
# FORMAT (docker or oci, default docker) override the defaults. libpxn.so at
# the repository root is packed when present.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-_output/images}
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/pxn/Chart.yaml)
image=${IMAGE:-pxn:$version}
pause_image=${PAUSE_IMAGE:-pause:3.10}
format=${FORMAT:-docker}

bin=$out/bin
rm -rf "$bin"
mkdir -p "$bin"
CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "$bin/" ./cmd/...

adds=()
for f in "$bin"/*; do
  adds+=(-add "$f:/usr/local/bin/$(basename "$f"):0755")
done
if [ -f libpxn.so ]; then
  adds+=(-add "libpxn.so:/usr/local/lib/libpxn.so:0755")
fi
go run ./hack/image -o "$out/pxn.tar" -name "$image" -format "$format" -ldd "${adds[@]}" \
  -env PATH=/usr/local/bin:/usr/bin:/bin -env LD_LIBRARY_PATH=/usr/local/lib \
  -entrypoint /usr/local/bin/pxn-agent
go run ./hack/image -o "$out/pause.tar" -name "$pause_image" -format "$format" -pause
