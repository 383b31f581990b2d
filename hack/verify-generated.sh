#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails, showing the difference, when a generated file in the working tree is
# not what hack/generate.sh produces from the sources. It regenerates into a
# temporary copy of the tree and leaves the working tree alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$root"
# Tracked and untracked files that git does not ignore: what a commit holds.
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done >"$tmp/files"
mkdir -p "$tmp/committed" "$tmp/generated"
tar -C "$root" --null -T "$tmp/files" -cf - | tar -C "$tmp/committed" -xf -
cp -a "$tmp/committed/." "$tmp/generated/"

# The copy shares the tools cache of the working tree.
export PXN_TOOLS_DIR=${PXN_TOOLS_DIR:-$root/.tools}
(cd "$tmp/generated" && bash hack/generate.sh)

if ! diff -ruN --no-dereference "$tmp/committed" "$tmp/generated" >"$tmp/diff"; then
  echo "generated files are stale; run hack/generate.sh (make generate):" >&2
  sed -e "s|$tmp/committed/||g; s|$tmp/generated/||g" "$tmp/diff" >&2
  exit 1
fi
echo "generated files are up to date"
