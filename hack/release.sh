#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make release: what a release of this tree ships, in OUTDIR (default
# _output/release):
#   pxn-<VERSION>.oci.tar   the pxn image for PLATFORMS (default linux/amd64,linux/arm64),
#                           one OCI image index in an OCI layout archive
#                           (skopeo copy oci-archive:... docker://REGISTRY/pxn:<VERSION>)
#   pxn-<VERSION>.tgz       the chart (helm package)
#   CHANGELOG-<VERSION>.md  this version's entry of CHANGELOG.md
#   SHA256SUMS
# Fails when CHANGELOG.md has no entry for VERSION or the chart's version
# differs from it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-_output/release}
version=$(cat VERSION)
export PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}

chart_version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/pxn/Chart.yaml)
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/pxn/Chart.yaml)
if [ "$chart_version" != "$version" ] || [ "$app_version" != "$version" ]; then
  echo "release: VERSION is $version, Chart.yaml version $chart_version appVersion $app_version" >&2
  exit 1
fi
# The entry runs from "## [VERSION]" to the next "## [" heading.
entry=$(awk -v v="$version" '
  /^## \[/ { if (on) exit; if (index($0, "## [" v "]") == 1) on = 1 }
  on { print }' CHANGELOG.md)
if [ -z "$entry" ]; then
  echo "release: CHANGELOG.md has no \"## [$version]\" entry" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"
printf '%s\n' "$entry" >"$out/CHANGELOG-$version.md"

helm=$(bash hack/tools.sh path helm)
[ -x "$helm" ] || bash hack/tools.sh helm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
HELM_CACHE_HOME=$tmp/cache HELM_CONFIG_HOME=$tmp/config HELM_DATA_HOME=$tmp/data \
  "$helm" package charts/pxn --destination "$out" >&2

FORMAT=oci IMAGE=${IMAGE:-ghcr.io/pxn-project/pxn:$version} bash hack/image/build.sh "$tmp/images"
mv "$tmp/images/pxn.oci.tar" "$out/pxn-$version.oci.tar"

(cd "$out" && sha256sum -- * >SHA256SUMS)
echo "release $version in $out:" >&2
ls -l "$out" >&2
