# PXN — see README.md.
SHELL := /bin/bash
GO ?= go
TOOLS := hack/tools.sh
BIN := bin
GOTEST_FLAGS ?= -race -timeout 30m

.PHONY: all build test tools generate lint bench bench-baseline fuzz demo demo-host cluster-demo clean

all: build

build:
	CGO_ENABLED=1 $(GO) build ./...
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) build -o $(BIN)/ ./cmd/...

tools:
	@$(TOOLS)

generate: tools
	@hack/generate.sh

lint: tools
	@hack/lint.sh

# The project's test command: lint, then every test with the race detector.
# PXN_REQUIRE_TOOLS makes a test that needs a tool fail instead of skip.
test: lint
	PXN_REQUIRE_TOOLS=1 PXN_TOOLS_DIR=$${PXN_TOOLS_DIR:-$(CURDIR)/.tools} \
	KUBEBUILDER_ASSETS=$$($(TOOLS) assets) \
	$(GO) test $(GOTEST_FLAGS) ./...

# The Mooncake transport (integrations/mooncake) against a Mooncake checkout:
# _output/mooncake/libpxn_mooncake.a and libpxn.so, and the factory patch
# compiled on a copy of the checkout's multi_transport.cpp. make test runs
# its tests through go test ./...; mooncake-test runs them alone.
.PHONY: mooncake mooncake-test
MOONCAKE_SRC ?= ../shared/reference/mooncake
mooncake:
	@$(MAKE) -C integrations/mooncake all patch-check MOONCAKE_SRC=$(abspath $(MOONCAKE_SRC)) OUT=$(CURDIR)/_output/mooncake

mooncake-test:
	MOONCAKE_SRC=$(abspath $(MOONCAKE_SRC)) $(GO) test -count=1 -v ./integrations/mooncake/

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The relay benchmarks on a baseline commit and on this tree, alternately,
# and a Markdown table of the two (BASELINE, BENCH, BENCHTIME, ROUNDS, PKG:
# see hack/bench-baseline.sh).
bench-baseline:
	@hack/bench-baseline.sh

fuzz:
	@hack/fuzz.sh

# The README's main command: a real single-node Kubernetes cluster on this
# machine (root; see docs/local-cluster.md) with the chart installed, the
# node's PxnRailMap, the pxn.io/relay resource, and pxn-bench in a Job whose
# eight ranks write across rails. CLUSTER_DEMO_FLAGS=--keep leaves it up.
demo:
	@hack/cluster-demo.sh $(CLUSTER_DEMO_FLAGS)

cluster-demo: demo

# The engine alone on the bundled 8-GPU layout, no Kubernetes and no root.
demo-host:
	@hack/demo.sh

clean:
	rm -rf $(BIN)
