# syntax=docker/dockerfile:1
# One image holding every PXN binary: pxn-agent, pxn-device-plugin, pxn-bench
# and, when the repository has one, libpxn.so. The binaries use cgo, so the
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
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /out/bin /out/lib && \
    go build -trimpath -ldflags "-s -w" -o /out/bin/ ./cmd/... && \
    if [ -f libpxn.so ]; then cp libpxn.so /out/lib/; fi

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pxn" \
      org.opencontainers.image.source="https://github.com/pxn-project/pxn" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/
ENV LD_LIBRARY_PATH=/usr/local/lib
ENTRYPOINT ["/usr/local/bin/pxn-agent"]
