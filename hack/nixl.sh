#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds NIXL with its Mooncake backend against a Mooncake shared build that
# carries PXN's transport (hack/mooncake.sh shared CONFIG), from the offline
# source bundle CI keeps beside the clone: abseil (shared, C++20, into a
# prefix of its own: NIXL refuses Debian's), then NIXL's core, its POSIX
# plugin and libplugin_Mooncake.so with meson. Cached in PXN_TOOLS_DIR: abseil
# keyed by its version, NIXL by its version and the Mooncake prefix's key (its
# key folder and configuration); a later run rebuilds what changed.
#
#   hack/nixl.sh build MC_PREFIX     build abseil and NIXL against MC_PREFIX
#                                    (lib/libtransfer_engine.so, lib/libasio.so,
#                                    include/transfer_engine_c.h); print NIXL's
#                                    build folder
#   hack/nixl.sh absl                build abseil alone (build does it first);
#                                    print its prefix
#   hack/nixl.sh path MC_PREFIX      print NIXL's build folder (it holds .built
#                                    once a build succeeded)
#   hack/nixl.sh env MC_PREFIX       print the shell lines a program built
#                                    against NIXL needs: NIXL_BUILD,
#                                    NIXL_PLUGIN_DIR (the Mooncake plugin's
#                                    folder), NIXL_CFLAGS, NIXL_LIBS,
#                                    NIXL_LIBPATH (for LD_LIBRARY_PATH)
#   hack/nixl.sh seam MC_PREFIX OUT  relink MC_PREFIX's libtransfer_engine.so
#                                    into OUT with Mooncake's rdma_transport.cpp
#                                    replaced by the project's emulated NIC
#                                    (integrations/mooncake/test/rdma_seam.cpp),
#                                    as module-seam.sh does for the Python
#                                    module; OUT gets libasio.so too
#   hack/nixl.sh version             print the NIXL version
#
# NIXL_REFERENCE: the folder of the bundle (default ../shared/reference/nixl-src
# beside the clone): nixl-1.4.0-*.tar.gz, abseil-cpp-*.tar.gz,
# taskflow-*.tar.gz, tomlplusplus-*.tar.gz.
# JOBS: parallel compile jobs (default: the number of CPUs).
# Needs: hack/host-packages.sh install nixl (meson, ninja, asio, pybind11,
# liburing, gmock); never libabsl-dev (NIXL's meson finds it and stops on its
# version).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PXN_TOOLS_DIR:-$root/.tools}
reference=${NIXL_REFERENCE:-$root/../shared/reference/nixl-src}
NIXL_VERSION=1.4.0
ABSL_VERSION=20250814.1
TASKFLOW_VERSION=3.10.0
TOML_VERSION=3.4.0
absl_dir=$cache/absl-$ABSL_VERSION

log() { echo "nixl: $*" >&2; }
die() { echo "nixl: $*" >&2; exit 1; }

# archive NAME: the bundle's archive NAME-*.tar.gz (NAME with its version).
archive() {
  local f
  f=$(compgen -G "$reference/$1*.tar.gz" | head -1) || true
  [ -n "$f" ] || die "no $1*.tar.gz in $reference (set NIXL_REFERENCE to the NIXL source bundle)"
  echo "$f"
}

# mc_prefix PREFIX: the absolute prefix, checked.
mc_prefix() {
  local p
  p=$(cd "$1" 2>/dev/null && pwd) || die "no Mooncake prefix $1 (hack/mooncake.sh shared CONFIG prints one)"
  for f in lib/libtransfer_engine.so lib/libasio.so include/transfer_engine_c.h; do
    [ -f "$p/$f" ] || die "the Mooncake prefix $p has no $f (hack/mooncake.sh shared CONFIG)"
  done
  echo "$p"
}

# nixl_dir PREFIX: NIXL's cache folder for PREFIX: a prefix laid out by
# hack/mooncake.sh (KEY/shared-CONFIG-prefix) is keyed by KEY and CONFIG,
# any other by a hash of its path.
nixl_dir() {
  local p=$1 key
  case $(basename "$p") in
    shared-*-prefix) key=$(basename "$(dirname "$p")")-$(basename "$p" -prefix) ;;
    *) key=prefix-$(printf '%s' "$p" | sha256sum | cut -c1-12) ;;
  esac
  echo "$cache/nixl-$NIXL_VERSION-$key"
}

build_absl() {
  [ -f "$absl_dir/prefix/.ready" ] && return
  local a start=$SECONDS
  a=$(archive abseil-cpp-$ABSL_VERSION)
  rm -rf "$absl_dir/src" "$absl_dir/build" "$absl_dir/prefix"
  mkdir -p "$absl_dir/src"
  tar xzf "$a" -C "$absl_dir/src" --strip-components=1
  log "building abseil $ABSL_VERSION ($absl_dir/build.log)"
  {
    cmake -S "$absl_dir/src" -B "$absl_dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_STANDARD=20 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_SHARED_LIBS=ON \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DABSL_BUILD_TESTING=OFF -DBUILD_TESTING=OFF \
      -DCMAKE_INSTALL_PREFIX="$absl_dir/prefix" -DCMAKE_INSTALL_LIBDIR=lib &&
      ninja -j"${JOBS:-$(nproc)}" -C "$absl_dir/build" install
  } >"$absl_dir/build.log" 2>&1 || { tail -30 "$absl_dir/build.log" >&2; die "building abseil failed ($absl_dir/build.log)"; }
  touch "$absl_dir/prefix/.ready"
  log "abseil built in $((SECONDS - start)) s: $absl_dir/prefix"
}

# prepare_nixl: NIXL's tree with taskflow and toml++ in subprojects (meson
# does not apply a wrap's patch folder to a folder already there, so
# taskflow's meson.build is copied in) and a pkg-config file for Debian's
# header-only asio, which ships none.
prepare_nixl() {
  local d=$cache/nixl-$NIXL_VERSION-src
  if [ ! -f "$d/.ready" ]; then
    rm -rf "$d"
    mkdir -p "$d/nixl" "$d/pc"
    tar xzf "$(archive nixl-$NIXL_VERSION)" -C "$d/nixl" --strip-components=1
    tar xzf "$(archive taskflow-$TASKFLOW_VERSION)" -C "$d/nixl/subprojects"
    [ -d "$d/nixl/subprojects/taskflow-$TASKFLOW_VERSION" ] ||
      die "taskflow's archive holds no taskflow-$TASKFLOW_VERSION folder"
    cp "$d/nixl/subprojects/packagefiles/taskflow/meson.build" "$d/nixl/subprojects/taskflow-$TASKFLOW_VERSION/"
    tar xzf "$(archive tomlplusplus-$TOML_VERSION)" -C "$d/nixl/subprojects"
    cat >"$d/pc/asio.pc" <<'EOF'
prefix=/usr
includedir=${prefix}/include
Name: asio
Description: Debian's header-only asio
Version: 1.22.1
Cflags: -I${includedir} -DASIO_STANDALONE
Libs:
EOF
    touch "$d/.ready"
  fi
  echo "$d"
}

build_nixl() {
  local p=$1 n=$2 s start=$SECONDS
  s=$(prepare_nixl)
  mkdir -p "$n"
  export PKG_CONFIG_PATH=$absl_dir/prefix/lib/pkgconfig:$s/pc
  # The Mooncake backend finds libtransfer_engine.so and transfer_engine_c.h
  # on the compiler's default paths (no meson option for either).
  export CPATH=$p/include${CPATH:+:$CPATH} LIBRARY_PATH=$p/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  if [ ! -f "$n/build/build.ninja" ]; then
    rm -rf "$n/build"
    meson setup "$n/build" "$s/nixl" --wrap-mode=nodownload --force-fallback-for=tomlplusplus \
      --buildtype=release -Dprefix="$n/install" -Denable_plugins=POSIX,MOONCAKE \
      -Ddisable_mooncake_backend=false -Ddisable_gds_backend=true \
      -Dbuild_docs=false -Dbuild_tests=false -Dbuild_examples=false >"$n/build.log" 2>&1 ||
      { tail -30 "$n/build.log" >&2; die "configuring NIXL failed ($n/build.log)"; }
  fi
  log "building NIXL $NIXL_VERSION against $p ($n/build.log)"
  ninja -j"${JOBS:-$(nproc)}" -C "$n/build" >>"$n/build.log" 2>&1 ||
    { grep -B2 -A12 -m3 'error' "$n/build.log" >&2 || tail -30 "$n/build.log" >&2; die "building NIXL failed ($n/build.log)"; }
  [ -f "$n/build/src/plugins/mooncake/libplugin_Mooncake.so" ] ||
    die "NIXL's build made no libplugin_Mooncake.so (was transfer_engine_c.h found? $n/build.log)"
  touch "$n/.built"
  log "NIXL built in $((SECONDS - start)) s: $n/build"
}

print_env() {
  local b=$1/build s=$cache/nixl-$NIXL_VERSION-src/nixl a=$absl_dir/prefix
  echo "NIXL_BUILD=$b"
  echo "NIXL_PLUGIN_DIR=$b/src/plugins/mooncake"
  echo "NIXL_CFLAGS='-std=c++20 -I$s/src/api/cpp -I$s/src/api/cpp/backend -I$s/src/utils -I$s/src/infra -I$s/src/core -I$b -I$a/include'"
  echo "NIXL_LIBS='-L$b/src/core -L$b/src/infra -L$b/src/utils/serdes -L$b/src/utils/common -L$a/lib -Wl,-rpath,$b/src/core:$b/src/infra:$b/src/utils/serdes:$b/src/utils/common:$b/src/utils/stream:$a/lib -lnixl -lnixl_build -lnixl_common'"
  echo "NIXL_LIBPATH=$b/src/core:$b/src/infra:$b/src/utils/serdes:$b/src/utils/common:$b/src/utils/stream:$a/lib"
}

# seam PREFIX OUT: the prefix's libtransfer_engine.so linked again with the
# emulated NIC in place of Mooncake's RdmaTransport, from the shared build
# folder beside the prefix (KEY/shared-CONFIG).
seam() {
  local p=$1 out=$2 b here=$root/integrations/mooncake/test line
  b=${p%-prefix}
  local te=$b/mooncake-transfer-engine/src
  for f in "$b/compile_commands.json" "$te/CMakeFiles/transfer_engine.dir/link.txt"; do
    [ -f "$f" ] || die "no $f: the seam needs the shared build beside a prefix of hack/mooncake.sh shared"
  done
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  "$here/seam-object.sh" "$b" "$out/rdma_seam.o"
  line=$(sed -e "s| transport/rdma_transport/CMakeFiles/rdma_transport.dir/rdma_transport.cpp.o | $out/rdma_seam.o |" \
    -e "s| -o libtransfer_engine.so | -o $out/libtransfer_engine.so -Wl,-rpath,'\$ORIGIN' |" \
    "$te/CMakeFiles/transfer_engine.dir/link.txt")
  grep -q "$out/rdma_seam.o" <<<"$line" || die "no rdma_transport.cpp.o in $te/CMakeFiles/transfer_engine.dir/link.txt"
  (cd "$te" && eval "$line") || die "linking the seam library failed"
  cp "$p/lib/libasio.so" "$out/"
  echo "$out/libtransfer_engine.so"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  build)
    [ $# -eq 1 ] || die "usage: $0 build MC_PREFIX"
    for tool in cmake ninja meson pkg-config g++ python3; do
      command -v "$tool" >/dev/null 2>&1 || die "$tool not found (hack/host-packages.sh install nixl)"
    done
    [ -f /usr/include/asio.hpp ] || die "asio.hpp not found (hack/host-packages.sh install nixl: libasio-dev)"
    p=$(mc_prefix "$1")
    n=$(nixl_dir "$p")
    mkdir -p "$cache"
    (flock 9 && build_absl) 9>"$cache/absl-$ABSL_VERSION.lock"
    (flock 9 && prepare_nixl >/dev/null) 9>"$cache/nixl-$NIXL_VERSION-src.lock"
    mkdir -p "$n"
    (flock 9 && build_nixl "$p" "$n") 9>"$n.lock"
    echo "$n/build"
    ;;
  absl)
    command -v cmake >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1 || die "cmake or ninja not found (hack/host-packages.sh install nixl)"
    mkdir -p "$cache"
    (flock 9 && build_absl) 9>"$cache/absl-$ABSL_VERSION.lock"
    echo "$absl_dir/prefix"
    ;;
  path)
    [ $# -eq 1 ] || die "usage: $0 path MC_PREFIX"
    echo "$(nixl_dir "$(mc_prefix "$1")")/build"
    ;;
  env)
    [ $# -eq 1 ] || die "usage: $0 env MC_PREFIX"
    n=$(nixl_dir "$(mc_prefix "$1")")
    [ -f "$n/.built" ] || die "NIXL is not built against $1 yet (hack/nixl.sh build $1)"
    print_env "$n"
    ;;
  seam)
    [ $# -eq 2 ] || die "usage: $0 seam MC_PREFIX OUT"
    seam "$(mc_prefix "$1")" "$2"
    ;;
  version) echo "$NIXL_VERSION" ;;
  *) die "usage: $0 build MC_PREFIX | absl | path MC_PREFIX | env MC_PREFIX | seam MC_PREFIX OUT | version" ;;
esac
