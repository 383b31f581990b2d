#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# go build with its arguments, printing the compiler's output except the
# blocks of packages that are not ours and whose warnings we cannot fix:
# go-nvml's C header declares NVML functions deprecated and its own cgo code
# calls them (some 150 lines on a cold build). A warning from any other
# package, ours above all, is printed; a failed build prints everything.
set -euo pipefail
go=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$go" build "$@" 2> "$log"; then
  cat "$log" >&2
  exit 1
fi
awk '/^# / { skip = ($2 == "github.com/NVIDIA/go-nvml/pkg/nvml") } !skip' "$log" >&2
