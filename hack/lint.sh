#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gofmt, go vet and staticcheck over the whole module; fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
unformatted=$(gofmt -l $(git ls-files -co --exclude-standard '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
go vet -tags pxnseams ./cmd/libpxn/
"$(hack/tools.sh path staticcheck)" ./...
"$(hack/tools.sh path staticcheck)" -tags pxnseams ./cmd/libpxn/
echo "lint: gofmt, go vet and staticcheck clean"
