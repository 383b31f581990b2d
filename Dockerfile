# SPDX-License-Identifier: Apache-2.0
# syntax=docker/dockerfile:1
# One image holding every PXN binary: pxn-agent, pxn-device-plugin,
# pxn-dra-plugin, pxn-bench, pxn-gpucheck and libpxn.so, stamped with the
# VERSION file's release:
#
#   docker build --build-arg VERSION=$(cat VERSION) --build-arg REVISION=$(git rev-parse HEAD) .
#
# VERSION only labels the image; the binaries read the VERSION file, and the
# build fails when the two differ. The binaries use cgo, so the
# runtime base has glibc; the build image and the base are both Debian 12,
# so the binaries never need a newer glibc than the base carries. CUDA and
# NVML libraries are not in the image: they are loaded at run time from what
# the NVIDIA container runtime mounts. hack/image builds the same image
# without a Docker engine (docs/images.md).
ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/base-debian12

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=1
ARG VERSION=""
ARG REVISION=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    release=$(cat VERSION) && \
    if [ -n "$VERSION" ] && [ "$VERSION" != "$release" ]; then \
      echo "--build-arg VERSION=$VERSION but the VERSION file says $release" >&2; exit 1; fi && \
    pkg=github.com/pxn-project/pxn/internal/version && \
    ldflags="-s -w -X $pkg.version=$release${REVISION:+ -X $pkg.revision=$REVISION}" && \
    mkdir -p /out/bin /out/lib && \
    go build -trimpath -ldflags "$ldflags" -o /out/bin/ ./cmd/pxn-agent ./cmd/pxn-device-plugin ./cmd/pxn-dra-plugin ./cmd/pxn-bench ./cmd/pxn-gpucheck && \
    go build -trimpath -buildmode=c-shared -ldflags "$ldflags" -o /out/lib/libpxn.so ./cmd/libpxn && \
    rm -f /out/lib/libpxn.h

FROM ${BASE_IMAGE}
ARG VERSION=""
ARG REVISION=""
LABEL org.opencontainers.image.title="pxn" \
      org.opencontainers.image.source="https://github.com/pxn-project/pxn" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/
ENV LD_LIBRARY_PATH=/usr/local/lib
ENTRYPOINT ["/usr/local/bin/pxn-agent"]
