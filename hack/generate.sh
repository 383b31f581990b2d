#!/usr/bin/env bash
# Regenerates every generated file. hack/verify-generated.sh checks that the
# committed files match.
set -euo pipefail
cd "$(dirname "$0")/.."
go generate ./...
