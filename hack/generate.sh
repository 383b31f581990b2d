#!/usr/bin/env bash
# Regenerates every generated file. hack/verify-generated.sh checks that the
# committed files match.
set -euo pipefail
cd "$(dirname "$0")/.."
go generate ./...

# Deepcopy methods for the API types and the CRD manifests built from them.
controller_gen=$(bash hack/tools.sh path controller-gen)
[ -x "$controller_gen" ] || bash hack/tools.sh controller-gen
"$controller_gen" object paths=./api/... crd paths=./api/... output:crd:artifacts:config=config/crd
