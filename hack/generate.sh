#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates every generated file. hack/verify-generated.sh checks that the
# committed files match.
set -euo pipefail
cd "$(dirname "$0")/.."
go generate ./...

# Deepcopy methods for the API types and the CRD manifests built from them.
controller_gen=$(bash hack/tools.sh path controller-gen)
[ -x "$controller_gen" ] || bash hack/tools.sh controller-gen
"$controller_gen" object:headerFile=hack/boilerplate.go.txt paths=./api/... crd paths=./api/... output:crd:artifacts:config=config/crd
