#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copies the generated CRDs (config/crd/*.yaml, from controller-gen) into the
# chart's crds/ folder, which Helm installs before the templates. Run it after
# hack/generate.sh; test/chart fails while the two folders differ.
set -euo pipefail
cd "$(dirname "$0")/.."
src=config/crd
dst=charts/pxn/crds
shopt -s nullglob
crds=("$src"/*.yaml)
if [ ${#crds[@]} -eq 0 ]; then
  echo "sync-chart-crds: no CRDs in $src (run hack/generate.sh first)" >&2
  exit 1
fi
mkdir -p "$dst"
for f in "$dst"/*.yaml; do
  [ -e "$src/$(basename "$f")" ] || rm -f "$f"
done
cp "${crds[@]}" "$dst"/
echo "sync-chart-crds: copied ${#crds[@]} CRD(s) to $dst"
