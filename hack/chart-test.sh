#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tests the packaging: the chart (lint, rendering, schema, validation, a
# server-side dry run against a real kube-apiserver) and the image builder.
# Builds the tools it needs into the cache first (hack/tools.sh).
#
#   hack/chart-test.sh [go test flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/tools.sh helm etcd kube-apiserver kubectl
KUBEBUILDER_ASSETS=$(bash hack/tools.sh assets)
export KUBEBUILDER_ASSETS PXN_REQUIRE_TOOLS=1
go test "$@" ./test/chart/ ./hack/image/...
