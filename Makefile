# SPDX-License-Identifier: Apache-2.0
# PXN — see README.md.
SHELL := /bin/bash
GO ?= go
TOOLS := hack/tools.sh
BIN := bin
GOTEST_FLAGS ?= -race -timeout 30m

# The release this tree is; every binary is stamped with it (internal/version).
VERSION := $(shell cat VERSION)
REVISION := $(shell git rev-parse HEAD 2>/dev/null)
VERSION_PKG := github.com/pxn-project/pxn/internal/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION)$(if $(REVISION), -X $(VERSION_PKG).revision=$(REVISION))

.PHONY: all build libpxn unit e2e test host-packages tools generate lint bench bench-baseline fuzz gpu-kit demo demo-host cluster-demo image release clean

all: build

# The shipped artifacts only: the binaries and libpxn.so (its header is
# include/pxn.h; the one go build generates beside the library is dropped).
# Compiler output of dependencies is filtered as in the demo (hack/gobuild.sh).
COMMANDS := $(filter-out ./cmd/libpxn,$(patsubst %/,./%,$(wildcard cmd/*/)))
build: libpxn
	@CGO_ENABLED=1 hack/gobuild.sh -ldflags "$(LDFLAGS)" -o $(BIN)/ $(COMMANDS)
	@echo "build: $(notdir $(COMMANDS)) libpxn.so in $(BIN)/"

libpxn:
	@mkdir -p $(BIN)
	@CGO_ENABLED=1 hack/gobuild.sh -buildmode=c-shared -ldflags "$(LDFLAGS)" -o $(BIN)/libpxn.so ./cmd/libpxn
	@rm -f $(BIN)/libpxn.h

tools:
	@$(TOOLS)

generate: tools
	@hack/generate.sh

lint: tools
	@hack/lint.sh

# The project's test command: lint, the packages the end-to-end suite needs
# (installed when missing, as make demo does), then every test with the race
# detector. PXN_REQUIRE_TOOLS makes a test that needs a tool fail instead of
# skip; the end-to-end suite still skips, saying why, when this machine cannot
# install its packages (not root, no apt-get). The allocation tests skip
# under the race detector (it allocates on its own), so they run a second
# time without it, in the packages that have one (a Test...Alloc... name).
# That second run also runs every benchmark once (-benchtime 1x), so that a
# benchmark that no longer runs fails here, not when someone takes a
# figure; its numbers measure nothing. hack/testreport prints go test's
# usual lines as they come and, at the end, every test and benchmark that
# skipped with its message and the counts; the whole -json stream stays in
# _output/test.json.
# make unit: every package's tests but the end-to-end suite and the Mooncake
# build's, without the race detector, the cluster or Mooncake; tests that
# need a tool that is not built skip and say so. make e2e: the end-to-end
# suite alone, on the local cluster (root; installs its packages).
UNIT_PKGS = $(shell $(GO) list ./... | grep -v -e /test/e2e -e /integrations/mooncake)
unit:
	@mkdir -p _output
	@$(GO) build -o _output/testreport ./hack/testreport
	set -o pipefail; export PXN_TOOLS_DIR=$${PXN_TOOLS_DIR:-$(CURDIR)/.tools}; \
	$(GO) test -json -count=1 -timeout 20m $(UNIT_PKGS) | _output/testreport -save _output/unit.json

e2e: host-packages
	@mkdir -p _output
	@$(GO) build -o _output/testreport ./hack/testreport
	set -o pipefail; export PXN_REQUIRE_TOOLS=1 PXN_TOOLS_DIR=$${PXN_TOOLS_DIR:-$(CURDIR)/.tools}; \
	export KUBEBUILDER_ASSETS=$$($(TOOLS) assets); \
	$(GO) test -json -count=1 -timeout 40m ./test/e2e/ | _output/testreport -save _output/e2e.json

TEST_PKGS ?= ./...
ALLOC_PKGS ?= $(sort $(addprefix ./,$(dir $(shell grep -rlE --include='*_test.go' '^func Test[A-Za-z0-9_]*Alloc' api cmd hack integrations internal pkg test))))
BENCH_PKGS ?= $(sort $(addprefix ./,$(dir $(shell grep -rlE --include='*_test.go' '^func Benchmark' api cmd hack integrations internal pkg test))))
test: lint host-packages mooncake mooncake-wheel nixl
	@mkdir -p _output
	@$(GO) build -o _output/testreport ./hack/testreport
	set -o pipefail; export PXN_REQUIRE_TOOLS=1 PXN_TOOLS_DIR=$${PXN_TOOLS_DIR:-$(CURDIR)/.tools} $(MOONCAKE_TREE_ENV); \
	export KUBEBUILDER_ASSETS=$$($(TOOLS) assets); \
	( rc=0; $(GO) test -json $(GOTEST_FLAGS) $(TEST_PKGS) || rc=1; \
	  $(GO) test -json -count=1 -timeout 30m -run Alloc -bench . -benchtime 1x $(sort $(ALLOC_PKGS) $(BENCH_PKGS)) || rc=1; exit $$rc ) \
	| _output/testreport -save _output/test.json

# What the end-to-end suite, make demo, hack/local-cluster.sh, the Mooncake
# transport and the arm64 image tests need from the machine
# (hack/host-packages.sh owns the list).
host-packages:
	@hack/host-packages.sh ensure cluster mooncake nixl cross

# Mooncake's transfer engine with PXN's transport compiled inside it
# (integrations/mooncake/patches/mooncake.patch), in every configuration, with
# Mooncake's unit tests and PXN's layout check: hack/mooncake.sh, cached in
# PXN_TOOLS_DIR by Mooncake commit and patch hash. The tree is MOONCAKE_TREE,
# else the reference copy beside the clone, else the tested commit fetched
# with git into PXN_TOOLS_DIR (hack/mooncake.sh source says which; with
# MOONCAKE_FETCH=0 and no tree it says so and the engine tests skip). make
# test runs the tests through go test ./...; mooncake-test runs them alone.
.PHONY: mooncake mooncake-seam mooncake-test
MOONCAKE_TREE ?=
MOONCAKE_TREE_ENV = $(if $(MOONCAKE_TREE),MOONCAKE_TREE=$(abspath $(MOONCAKE_TREE)))
MOONCAKE_SRC ?= ../shared/reference/mooncake
MOONCAKE_SH = $(MOONCAKE_TREE_ENV) PXN_TOOLS_DIR=$${PXN_TOOLS_DIR:-$(CURDIR)/.tools}
mooncake:
	@if $(MOONCAKE_SH) hack/mooncake.sh source >/dev/null; then $(MOONCAKE_SH) hack/mooncake.sh build; \
	else echo "mooncake: the engine is not built"; fi

# The patch as the upstream commit series (integrations/mooncake/patches/
# series), in _output/mooncake-series, each commit built and tested
# (hack/mooncake-series.sh check; long: one engine build per commit, ccache
# shared). make test checks only the series' last tree against the patch.
.PHONY: mooncake-series
mooncake-series:
	@$(MOONCAKE_SH) hack/mooncake-series.sh check

# The transport beside a Mooncake checkout, against the link seam its NIC
# tests use: _output/mooncake/libpxn_mooncake.a and libpxn.so, and the
# factory part of the patch compiled on a copy of multi_transport.cpp.
mooncake-seam:
	@$(MAKE) -C integrations/mooncake all patch-check MOONCAKE_SRC=$(abspath $(MOONCAKE_SRC)) OUT=$(CURDIR)/_output/mooncake

# Mooncake's Python module mooncake.engine with PXN's transport, in every
# configuration, each packed as a wheel with libpxn.so beside the module
# (hack/mooncake-wheel.sh): the module's build is cached in PXN_TOOLS_DIR like
# the engine's, the wheels go to _output/mooncake-wheel/CONFIG/. Its Mooncake
# tree is the engine's.
.PHONY: mooncake-wheel
mooncake-wheel: libpxn
	@if $(MOONCAKE_SH) hack/mooncake.sh source >/dev/null; then \
		LIBPXN=$(CURDIR)/$(BIN)/libpxn.so $(MOONCAKE_SH) hack/mooncake-wheel.sh build; \
	else echo "mooncake-wheel: no wheel is built"; fi

# make mooncake-image BASE=<one-image OCI archive of a serving image>: the
# default wheel unpacked into the base's site-packages (PYTHON_SITE) and
# libpxn.so in /usr/local/lib, one layer over BASE, in _output/mooncake-image.tar.
.PHONY: mooncake-image
mooncake-image: mooncake-wheel
	@[ -n "$(BASE)" ] || { echo "mooncake-image: set BASE to a one-image OCI archive of the serving image"; exit 2; }
	@$(MOONCAKE_SH) hack/mooncake-wheel.sh image $(abspath $(BASE)) $(CURDIR)/_output/mooncake-image.tar

# A folder to build the module with USE_CUDA=ON on a machine without
# Mooncake's packages or network: _output/mooncake-cuda-kit
# (hack/mooncake-cuda-kit.sh; there, run its kit-build.sh).
.PHONY: mooncake-cuda-kit
mooncake-cuda-kit: libpxn
	@LIBPXN=$(CURDIR)/$(BIN)/libpxn.so $(MOONCAKE_SH) hack/mooncake-cuda-kit.sh

# P15: Mooncake's batch_transfer_sync_write of 256 blocks of 4 KiB, PXN on
# against off, through the default wheel's module linked against the link
# seam (hack/mooncake-p15.sh); prints the table with the date and commit.
.PHONY: bench-mooncake
bench-mooncake: mooncake-wheel
	@$(MOONCAKE_SH) hack/mooncake-p15.sh

mooncake-test: mooncake mooncake-wheel
	MOONCAKE_SRC=$(abspath $(MOONCAKE_SRC)) $(MOONCAKE_SH) $(GO) test -count=1 -v ./integrations/mooncake/

# NIXL 1.4's Mooncake backend through PXN (docs/integration-nixl.md):
# Mooncake's shared library with PXN's transport in every configuration
# (hack/mooncake.sh shared) and abseil and NIXL built against the default one
# (hack/nixl.sh), cached in PXN_TOOLS_DIR; sources from
# ../shared/reference/nixl-src or NIXL_REFERENCE. make test runs
# integrations/nixl's test on them (each configuration's library relinked
# with the link seam, integrations/nixl/test/nixl_pxn.cpp, four processes
# writing through a relay: integrations/nixl/test/run.sh); nixl-test runs the
# same in NIXL_MOONCAKE_CONFIG alone, in _output/nixl, and keeps its logs.
.PHONY: nixl nixl-test
NIXL_MOONCAKE_CONFIG ?= default
NIXL_OUT := _output/nixl
nixl:
	@set -euo pipefail; \
	if ! $(MOONCAKE_SH) hack/mooncake.sh source >/dev/null; then echo "nixl: no Mooncake tree: NIXL is not built"; exit 0; fi; \
	for cfg in $$($(MOONCAKE_SH) hack/mooncake.sh configs); do $(MOONCAKE_SH) hack/mooncake.sh shared $$cfg >/dev/null; done; \
	$(MOONCAKE_SH) hack/nixl.sh build "$$($(MOONCAKE_SH) hack/mooncake.sh shared-prefix default)" >/dev/null

nixl-test: libpxn nixl
	@CGO_ENABLED=1 hack/gobuild.sh -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/pxn-agent
	@set -euo pipefail; mkdir -p $(NIXL_OUT); \
	mc=$$($(MOONCAKE_SH) hack/mooncake.sh shared-prefix $(NIXL_MOONCAKE_CONFIG)); \
	envs=$$($(MOONCAKE_SH) hack/nixl.sh env "$$($(MOONCAKE_SH) hack/mooncake.sh shared-prefix default)"); eval "$$envs"; \
	$(MOONCAKE_SH) hack/nixl.sh seam "$$mc" $(NIXL_OUT)/seam >/dev/null; \
	g++ -O2 $$NIXL_CFLAGS integrations/nixl/test/nixl_pxn.cpp -o $(NIXL_OUT)/nixl_pxn $$NIXL_LIBS; \
	LD_LIBRARY_PATH=$$NIXL_LIBPATH integrations/nixl/test/run.sh $(NIXL_OUT)/nixl_pxn $(NIXL_OUT)/seam \
		"$$NIXL_PLUGIN_DIR" $(BIN) $(NIXL_OUT)/run

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The relay benchmarks on a baseline commit and on this tree, alternately,
# and a Markdown table of the two (BASELINE, BENCH, BENCHTIME, ROUNDS, PKG:
# see hack/bench-baseline.sh).
bench-baseline:
	@hack/bench-baseline.sh

# Every fuzz target, one after another: FUZZTIME=60s make fuzz for a
# minute each (default 200000x), FUZZ_PKGS to pick packages.
fuzz:
	@hack/fuzz.sh

# Binaries for a GPU machine without Go, and the script that takes every GPU
# figure there (GPU_BASELINE: a commit whose pxn-bench gives the before rows).
gpu-kit:
	@hack/gpu-kit.sh build $(GPU_BASELINE)

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

# The pxn image for PLATFORMS (default linux/amd64,linux/arm64) as one OCI
# image index, in _output/images (hack/image/build.sh; docs/images.md).
PLATFORMS ?= linux/amd64,linux/arm64
image:
	PLATFORMS=$(PLATFORMS) FORMAT=oci hack/image/build.sh _output/images

# _output/release: the image index (OCI layout archive), the packaged chart
# and this version's CHANGELOG entry.
release:
	@PLATFORMS=$(PLATFORMS) hack/release.sh _output/release

clean:
	rm -rf $(BIN) _output
