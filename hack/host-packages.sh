#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one list of Debian packages that PXN's builds and its local cluster need
# from the machine, and the one place that installs them.
#
#   hack/host-packages.sh check GROUP...     list what is missing; exit 0 when nothing is
#   hack/host-packages.sh install GROUP...   apt-get install what is missing (root)
#   hack/host-packages.sh ensure GROUP...    install when it can; when it cannot (not
#                                            root, no apt-get) say why and exit 0
#   hack/host-packages.sh packages GROUP...  print the package names of the groups
#
# Groups:
#   build    gcc, make, git: building the binaries with cgo; gcc brings the
#            ASan and UBSan runtimes (libasan8, libubsan1) the sanitized tests use
#   cluster  runc, CNI plugins, openssl, curl, iptables, iproute2:
#            hack/local-cluster.sh, make demo and the end-to-end suite (test/e2e),
#            whose containerd hack/tools.sh builds; prometheus, which scrapes the
#            agent there
#   cross    gcc-aarch64-linux-gnu and the arm64 C library: hack/image for linux/arm64
#            and its tests
#   mooncake g++, patch and the headers Mooncake's transfer engine includes
#            (glog, gflags, jsoncpp, libibverbs, libnuma): integrations/mooncake;
#            cmake, yaml-cpp, googletest's sources, Python's headers (pybind11
#            looks for them) and ccache: the engine built with PXN's transport
#            (hack/mooncake.sh); Python's packaging tools (build, wheel,
#            setuptools, installer) and pytest: Mooncake's Python module
#            packed as a wheel and its tests (hack/mooncake-wheel.sh); clang with
#            libFuzzer: the transport's fuzz targets (hack/fuzz-mooncake.sh)
#   nixl     meson, ninja and the headers NIXL 1.4 builds against (asio,
#            pybind11, liburing, gmock): NIXL with its Mooncake backend
#            (hack/nixl.sh, make nixl-test), with the mooncake group; never
#            libabsl-dev (NIXL's meson finds it and refuses its version)
#
# Exit codes: 0 nothing missing (or ensure could not install and said why), 1 an
# install failed, 2 usage, 3 (check) something is missing and this machine
# cannot install it (the reason is printed, "cannot install: ..."), 4 (check)
# something is missing and install would add it.
set -euo pipefail

# group_needs GROUP: lines "PACKAGE TEST", TEST a command name or an absolute
# path that the package provides (a glob where the path names a version).
group_needs() {
  case $1 in
    build)
      echo "gcc gcc"
      echo "make make"
      echo "git git"
      ;;
    cluster)
      echo "runc runc"
      echo "containernetworking-plugins /usr/lib/cni/bridge"
      echo "containernetworking-plugins /usr/lib/cni/host-local"
      echo "containernetworking-plugins /usr/lib/cni/loopback"
      echo "openssl openssl"
      echo "curl curl"
      echo "iptables iptables"
      echo "iproute2 ip"
      echo "iproute2 ss"
      echo "prometheus prometheus"
      ;;
    cross)
      echo "gcc-aarch64-linux-gnu aarch64-linux-gnu-gcc"
      echo "libc6-dev-arm64-cross /usr/aarch64-linux-gnu/lib/libc.so.6"
      ;;
    mooncake)
      echo "g++ g++"
      echo "patch patch"
      echo "libgoogle-glog-dev /usr/include/glog/logging.h"
      echo "libgflags-dev /usr/include/gflags/gflags.h"
      echo "libjsoncpp-dev /usr/include/jsoncpp/json/json.h"
      echo "libibverbs-dev /usr/include/infiniband/verbs.h"
      echo "libnuma-dev /usr/include/numa.h"
      echo "cmake cmake"
      echo "libyaml-cpp-dev /usr/include/yaml-cpp/yaml.h"
      echo "libgtest-dev /usr/src/googletest/CMakeLists.txt"
      echo "python3-dev python3-config"
      echo "ccache ccache"
      echo "python3-build /usr/lib/python3/dist-packages/build/__init__.py"
      echo "python3-wheel /usr/lib/python3/dist-packages/wheel/__init__.py"
      echo "python3-setuptools /usr/lib/python3/dist-packages/setuptools/__init__.py"
      echo "python3-installer /usr/lib/python3/dist-packages/installer/__init__.py"
      echo "python3-pytest /usr/lib/python3/dist-packages/pytest/__init__.py"
      echo "clang clang++"
      # libFuzzer and the sanitizers' runtimes: clang only recommends them.
      echo "libclang-rt-dev /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a"
      ;;
    nixl)
      echo "meson meson"
      echo "ninja-build ninja"
      echo "libasio-dev /usr/include/asio.hpp"
      echo "pybind11-dev /usr/include/pybind11/pybind11.h"
      echo "liburing-dev /usr/include/liburing.h"
      echo "libgmock-dev /usr/include/gmock/gmock.h"
      ;;
    *) echo "host-packages: unknown group $1 (want build, cluster, cross, mooncake or nixl)" >&2; exit 2 ;;
  esac
}

present() {
  case $1 in
    /*) compgen -G "$1" >/dev/null ;;
    *) command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ] ;;
  esac
}

# missing GROUP...: the packages of the groups that are not installed, once each.
missing() {
  local g pkg test seen=" "
  for g in "$@"; do
    while read -r pkg test; do
      if ! present "$test" && [[ $seen != *" $pkg "* ]]; then
        seen+="$pkg "
        echo "$pkg"
      fi
    done < <(group_needs "$g")
  done
}

# why_not: why this machine cannot install packages; empty when it can.
why_not() {
  if [ "$(id -u)" != 0 ]; then
    echo "not root (uid $(id -u)): installing packages needs root"
  elif ! command -v apt-get >/dev/null 2>&1; then
    echo "no apt-get on this machine: install the packages with its own package manager"
  fi
}

install_pkgs() {
  export DEBIAN_FRONTEND=noninteractive
  echo "host-packages: apt-get install $*" >&2
  apt-get install -y -qq --no-install-recommends "$@" >&2 ||
    { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$@" >&2; }
}

[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
cmd=$1; shift
case $cmd in
  packages)
    for g in "$@"; do group_needs "$g"; done | awk '!seen[$1]++ {print $1}'
    ;;
  check | install | ensure)
    mapfile -t need < <(missing "$@")
    [ ${#need[@]} -eq 0 ] && exit 0
    why=$(why_not)
    case $cmd in
      check)
        echo "missing: ${need[*]}"
        if [ -n "$why" ]; then echo "cannot install: $why"; exit 3; fi
        exit 4
        ;;
      install)
        [ -z "$why" ] || { echo "host-packages: cannot install ${need[*]}: $why" >&2; exit 1; }
        ;;
      ensure)
        if [ -n "$why" ]; then
          echo "host-packages: cannot install ${need[*]} ($why); what needs them skips, saying so" >&2
          exit 0
        fi
        ;;
    esac
    install_pkgs "${need[@]}" || { echo "host-packages: apt-get install ${need[*]} failed" >&2; exit 1; }
    left=$(missing "$@")
    [ -z "$left" ] || { echo "host-packages: still missing after apt-get: $left" >&2; exit 1; }
    ;;
  *) echo "host-packages: unknown command $cmd (want check, install, ensure or packages)" >&2; exit 2 ;;
esac
