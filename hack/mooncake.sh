#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds Mooncake's transfer engine with PXN's transport inside it: copies a
# Mooncake source tree, applies integrations/mooncake/patches/mooncake.patch to
# the copy, and builds the engine, its unit tests and PXN's layout check with
# CMake, in a cache folder keyed by Mooncake commit and patch hash (the copy and
# the CMake build folders are kept; a later run rebuilds what changed, the
# transport's sources included). Each configuration has one CMake build folder,
# CONFIG, from integrations/mooncake/cmake (the transfer engine, its tests and
# the Python module): the module reuses the engine's objects.
#
#   hack/mooncake.sh build [CONFIG...]   build (default: every configuration)
#   hack/mooncake.sh dir CONFIG          print the transfer engine's folder in
#                                        CONFIG's build folder (it holds .built
#                                        once a build succeeded)
#   hack/mooncake.sh tests               print the Mooncake test programs that
#                                        run without an RDMA device or a
#                                        metadata server, one a line
#   hack/mooncake.sh configs             print the configurations
#   hack/mooncake.sh module [CONFIG...]  build Mooncake's Python module
#                                        mooncake.engine (target engine) with
#                                        the transport, in the engine's build
#                                        folder
#   hack/mooncake.sh module-dir CONFIG   print CONFIG's module build folder (it
#                                        holds .module-built once a build
#                                        succeeded; MOONCAKE_CMAKE_ARGS: below)
#   hack/mooncake.sh shared [CONFIG]     build Mooncake's shared library
#                                        libtransfer_engine.so (target
#                                        transfer_engine, BUILD_SHARED_LIBS=ON,
#                                        no unit tests) with the transport for
#                                        CONFIG (default: default) in
#                                        shared-CONFIG of the key folder, and
#                                        print the prefix it lays out beside
#                                        it: lib/libtransfer_engine.so,
#                                        lib/libasio.so and
#                                        include/transfer_engine_c.h (what
#                                        NIXL's Mooncake backend links:
#                                        hack/nixl.sh)
#   hack/mooncake.sh shared-prefix CONFIG
#                                        print that prefix (it holds .built
#                                        once a build succeeded)
#   hack/mooncake.sh commit              print the Mooncake commit of the tree
#
# Configurations: default (Mooncake's defaults: WITH_METRICS on) and event
# (USE_EVENT_DRIVEN_COMPLETION=ON, which changes TransferTask and BatchDesc).
#
#   hack/mooncake.sh source              print how the sources are had, one
#                                        line: "tree DIR", or "fetch URL COMMIT
#                                        DIR" when build or module would fetch
#   hack/mooncake.sh tree                print the tree; exit 1 when there is
#                                        none yet (fetched by build or module)
#
# The Mooncake sources, the first of: MOONCAKE_TREE, a Mooncake tree holding
# mooncake-transfer-engine, mooncake-common and extern/{pybind11,yalantinglibs}
# (and, for the module, mooncake-integration);
# the reference copy CI keeps beside the clone (MOONCAKE_REFERENCE); a clone
# of the tested commit in the cache, fetched once with git from MOONCAKE_GIT
# (default Mooncake's GitHub repository; MOONCAKE_FETCH=0 forbids it).
# MOONCAKE_COMMIT: the tree's commit, when it is not a git checkout.
# MOONCAKE_CMAKE_ARGS: extra CMake options for the module's build alone (e.g.
# -DUSE_CUDA=ON on a machine with the CUDA toolkit), built in a folder of
# their own (the engine's objects compiled again with them).
# MOONCAKE_PATCH: the patch applied instead of the project's (the commit
# series' check builds each commit's tree: hack/mooncake-series.sh); the
# cache folder is keyed by its hash too.
# PXN_CHECKS: PXN's check programs built beside Mooncake's tests (default
# pxn_layout_test; empty for a tree that does not define it yet).
# PXN_TOOLS_DIR: the cache (default .tools in the repository).
# JOBS: parallel compile jobs (default: the number of CPUs). ccache is used
# when it is installed (its cache in the same folder).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PXN_TOOLS_DIR:-$root/.tools}
patch_file=${MOONCAKE_PATCH:-$root/integrations/mooncake/patches/mooncake.patch}
# The commit the patch is made and tested against (docs/integration-mooncake.md).
TESTED_COMMIT=3b5a594133958449a1feaf1c9e0fc1b553e34a28
reference=${MOONCAKE_REFERENCE:-$root/../shared/reference/mooncake-src/mooncake}
git_url=${MOONCAKE_GIT:-https://github.com/kvcache-ai/Mooncake.git}
fetched=$cache/mooncake-git-${TESTED_COMMIT:0:12}
src=
# The interpreter the module is built for (its ABI tag is in the module's name).
python=${PYTHON:-/usr/bin/python3}
CONFIGS=(default event)

# Mooncake's own test programs that pass without an RDMA device and without a
# metadata server (tcp_transport_test and transfer_metadata_test need one;
# the RDMA loopback and large-MR programs need a device).
MOONCAKE_TESTS=(
  transport_uint_test endpoint_store_test shared_segment_test
  rdma_endpoint_state_test worker_pool_rail_state_test
  endpoint_store_integration_test ctrl_frame_test sender_credit_test
  rdma_endpoint_reestablish_test rdma_async_event_drain_test
  tcp_write_visibility_test tcp_address_validation_test
  connect_pause_tracker_test dmabuf_export_test config_test
  rdma_gid_probe_test multi_transport_locality_test rdma_context_reprobe_test
  rdma_transport_submit_task_test topology_test memory_location_test
  common_test
)

log() { echo "mooncake: $*" >&2; }
die() { echo "mooncake: $*" >&2; exit 1; }

config_flags() {
  case $1 in
    default) echo "-DWITH_METRICS=ON -DUSE_EVENT_DRIVEN_COMPLETION=OFF" ;;
    event) echo "-DWITH_METRICS=ON -DUSE_EVENT_DRIVEN_COMPLETION=ON" ;;
    *) die "unknown configuration $1 (want: ${CONFIGS[*]})" ;;
  esac
}

# decide: how the sources are had (see source above); dies when there is no
# tree and fetching is forbidden.
decide() {
  if [ -n "${MOONCAKE_TREE:-}" ]; then
    echo "tree $MOONCAKE_TREE"
  elif [ -f "$reference/mooncake-transfer-engine/CMakeLists.txt" ]; then
    echo "tree $reference"
  elif [ -f "$fetched/.fetched" ]; then
    echo "tree $fetched"
  elif [ "${MOONCAKE_FETCH:-1}" = 0 ]; then
    die "no Mooncake tree: MOONCAKE_TREE is unset, there is none at $reference nor in $fetched, and MOONCAKE_FETCH=0 forbids fetching $TESTED_COMMIT"
  else
    echo "fetch $git_url $TESTED_COMMIT $fetched"
  fi
}

# fetch_tree URL COMMIT DIR: COMMIT and the two submodules the build reads,
# into DIR, which is marked complete only once all of it is there.
fetch_tree() {
  local url=$1 want=$2 dir=$3 tmp=$3.partial
  command -v git >/dev/null 2>&1 || die "git not found: fetching Mooncake $want needs it"
  log "fetching Mooncake $want from $url into $dir"
  rm -rf "$tmp"
  git init -q "$tmp"
  git -C "$tmp" fetch -q --depth 1 "$url" "$want" || die "fetching $want from $url failed (set MOONCAKE_TREE to a Mooncake tree instead)"
  git -C "$tmp" checkout -q FETCH_HEAD
  git -C "$tmp" submodule update -q --init extern/pybind11 extern/yalantinglibs ||
    die "fetching Mooncake's submodules extern/pybind11 and extern/yalantinglibs failed"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  touch "$dir/.fetched"
}

# use_src FETCH: sets src to the tree decide names; with FETCH 1 a clone
# decide asks for is fetched first, else src is where it would go.
use_src() {
  local how url want dir
  how=$(decide) || exit 1
  case $how in
    tree\ *) src=${how#tree } ;;
    fetch\ *)
      read -r _ url want dir <<<"$how"
      src=$dir
      if [ "$1" = 1 ]; then
        mkdir -p "$cache"
        (flock 9 && { [ -f "$dir/.fetched" ] || fetch_tree "$url" "$want" "$dir"; }) 9>"$dir.lock"
      fi
      ;;
  esac
}

check_src() {
  [ -f "$src/mooncake-transfer-engine/CMakeLists.txt" ] ||
    die "the Mooncake tree $src holds no mooncake-transfer-engine/CMakeLists.txt: not a Mooncake tree"
  [ -f "$src/extern/yalantinglibs/CMakeLists.txt" ] ||
    die "the Mooncake tree $src has no extern/yalantinglibs (git submodule update --init)"
  [ -f "$patch_file" ] || die "no patch at $patch_file"
}

commit() {
  if git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
    git -C "$src" rev-parse HEAD
  else
    echo "${MOONCAKE_COMMIT:-$TESTED_COMMIT}"
  fi
}

key_dir() {
  local c p
  c=$(commit)
  p=$(sha256sum "$patch_file" | cut -c1-12)
  echo "$cache/mooncake-${c:0:12}-$p"
}

# prepare DIR: the patched copy of the sources and yalantinglibs' headers,
# installed into a private prefix; both made once.
prepare() {
  local dir=$1
  if [ ! -f "$dir/src/.patched" ]; then
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    cp -R "$src/." "$dir/src/"
    chmod -R u+w "$dir/src"
    patch -p1 --quiet --forward -d "$dir/src" <"$patch_file" ||
      die "$patch_file does not apply to Mooncake $(commit) at $src"
    touch "$dir/src/.patched"
  fi
  if [ ! -f "$dir/ylt-prefix/.ready" ]; then
    cmake -S "$dir/src/extern/yalantinglibs" -B "$dir/ylt" \
      -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF \
      -DINSTALL_STANDALONE=OFF -DCMAKE_INSTALL_PREFIX="$dir/ylt-prefix" >"$dir/ylt.log"
    cmake --build "$dir/ylt" >>"$dir/ylt.log"
    cmake --install "$dir/ylt" >>"$dir/ylt.log"
    touch "$dir/ylt-prefix/.ready"
  fi
}

# ccache_launcher DIR: sets launcher to CMake's compiler-launcher options when
# ccache is installed, its cache in the tools folder.
ccache_launcher() {
  launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    export CCACHE_DIR=$cache/ccache CCACHE_BASEDIR=$1 CCACHE_NOHASHDIR=1
  fi
}

# configure B LOG SRC ARGS...: configures B from SRC unless it was configured
# with the same options (cmake --build reconfigures by itself when a CMake
# file changed). A folder configured from another source folder (an earlier
# layout of the cache) is emptied first: CMake refuses to switch sources.
configure() {
  local b=$1 log=$2 s=$3 home
  shift 3
  if [ -f "$b/CMakeCache.txt" ] && [ "$(cat "$b/.options" 2>/dev/null)" = "$*" ]; then
    : >"$log"
    return
  fi
  rm -f "$b/.options"
  if [ -f "$b/CMakeCache.txt" ]; then
    home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$b/CMakeCache.txt")
    [ "$home" = "$s" ] || rm -rf "$b"
  fi
  cmake -S "$s" -B "$b" "$@" >"$log" 2>&1 || { tail -30 "$log" >&2; die "configuring $b failed ($log)"; }
  echo "$*" >"$b/.options"
}

# engine_args DIR CONFIG: sets args to the CMake options of CONFIG's build
# folder (integrations/mooncake/cmake: the engine, its tests and the module),
# so the module links the objects the engine's build compiled: one
# configuration, one compile of every transfer-engine source.
# BUILD_UNIT_TESTS=ON, which the engine's tests need, also compiles
# tcp_transport with Mooncake's test hooks (unset function pointers), the
# module's copy included.
engine_args() {
  local dir=$1 cfg=$2
  local -a flags
  read -r -a flags <<<"$(config_flags "$cfg")"
  ccache_launcher "$dir"
  # ASIO_INCLUDE_DIR: mooncake-common looks for asio.hpp, which a pruned
  # yalantinglibs may lack; the asio it compiles is yalantinglibs' own.
  args=(
    -DCMAKE_BUILD_TYPE=Release -DENABLE_DEBUG_SYMBOLS=OFF
    -DCMAKE_PREFIX_PATH="$dir/ylt-prefix" -DASIO_INCLUDE_DIR="$dir/ylt-prefix/include"
    -DPython3_EXECUTABLE="$python" -DPYTHON_EXECUTABLE="$python"
    -DUSE_CUDA=OFF -DUSE_TENT=OFF -DUSE_ETCD=OFF -DUSE_REDIS=OFF -DUSE_HTTP=OFF
    -DUSE_TCP=ON "${flags[@]}"
    -DUSE_PXN=ON -DPXN_SOURCE_DIR="$root"
    -DMOONCAKE_SOURCE_DIR="$dir/src"
    -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=ON
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON
    -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest
    "${launcher[@]}"
  )
}

build_config() {
  local dir=$1 cfg=$2 b=$1/$2 start=$SECONDS launcher=() args=()
  engine_args "$dir" "$cfg"
  configure "$b" "$b.log" "$root/integrations/mooncake/cmake" "${args[@]}"
  local -a checks
  read -r -a checks <<<"${PXN_CHECKS-pxn_layout_test}"
  cmake --build "$b" -j"${JOBS:-$(nproc)}" --target transfer_engine "${checks[@]}" "${MOONCAKE_TESTS[@]}" \
    >>"$b.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$b.log" >&2 || tail -40 "$b.log" >&2; die "building $cfg failed ($b.log)"; }
  touch "$b/mooncake-transfer-engine/.built"
  log "$cfg built in $((SECONDS - start)) s: $b"
}

# module_name CONFIG: the module's build folder in the key folder: CONFIG's
# own, the engine's; with MOONCAKE_CMAKE_ARGS, extra CMake options for the
# module (e.g. -DUSE_CUDA=ON), which change the engine's objects too, a folder
# of their own, CONFIG-x and 8 hex digits of their hash, which the wheel's
# version repeats.
module_name() {
  if [ -n "${MOONCAKE_CMAKE_ARGS:-}" ]; then
    echo "$1-x$(printf '%s' "$MOONCAKE_CMAKE_ARGS" | sha256sum | cut -c1-8)"
  else
    echo "$1"
  fi
}

# build_module DIR CONFIG: mooncake.engine and the libasio.so it links, target
# engine in DIR/$(module_name CONFIG), configured as the engine's build, then
# MOONCAKE_CMAKE_ARGS; where the engine's build ran, only the module's own
# sources are compiled. Marks the folder with .module-built.
build_module() {
  local dir=$1 cfg=$2 b start=$SECONDS launcher=() args=()
  b=$dir/$(module_name "$cfg")
  local -a extra
  read -r -a extra <<<"${MOONCAKE_CMAKE_ARGS:-}"
  [ -d "$dir/src/mooncake-integration/transfer_engine" ] ||
    die "the Mooncake tree $src has no mooncake-integration/transfer_engine: the module cannot be built from it"
  engine_args "$dir" "$cfg"
  configure "$b" "$b.log" "$root/integrations/mooncake/cmake" "${args[@]}" "${extra[@]}"
  cmake --build "$b" -j"${JOBS:-$(nproc)}" --target engine >>"$b.log" 2>&1 ||
    { grep -B2 -A12 -m3 'error' "$b.log" >&2 || tail -40 "$b.log" >&2; die "building the module ($cfg) failed ($b.log)"; }
  touch "$b/.module-built"
  log "module $cfg built in $((SECONDS - start)) s: $b"
}

# build_shared DIR CONFIG: libtransfer_engine.so and the libasio.so it links,
# configured as CONFIG's engine build with shared libraries and without
# Mooncake's unit tests, in DIR/shared-CONFIG; the prefix DIR/shared-CONFIG-
# prefix gets copies of the two libraries and Mooncake's C API header. The
# copied libtransfer_engine.so keeps the RUNPATH of its build folder: a
# program that loads it from the prefix puts the prefix's lib/ on its
# library path (docs/integration-nixl.md).
build_shared() {
  local dir=$1 cfg=$2 b=$1/shared-$2 p=$1/shared-$2-prefix start=$SECONDS launcher=() args=()
  engine_args "$dir" "$cfg"
  args=("${args[@]/-DBUILD_UNIT_TESTS=ON/-DBUILD_UNIT_TESTS=OFF}" -DBUILD_SHARED_LIBS=ON)
  configure "$b" "$b.log" "$root/integrations/mooncake/cmake" "${args[@]}"
  cmake --build "$b" -j"${JOBS:-$(nproc)}" --target transfer_engine >>"$b.log" 2>&1 ||
    { grep -B2 -A12 -m3 'error' "$b.log" >&2 || tail -40 "$b.log" >&2; die "building the shared library ($cfg) failed ($b.log)"; }
  local f
  for f in "$b/mooncake-transfer-engine/src/libtransfer_engine.so" "$b/mooncake-common/libasio.so" \
    "$dir/src/mooncake-transfer-engine/include/transfer_engine_c.h"; do
    [ -f "$f" ] || die "the shared build ($cfg) made no $f"
  done
  rm -rf "$p"
  mkdir -p "$p/lib" "$p/include"
  cp "$b/mooncake-transfer-engine/src/libtransfer_engine.so" "$b/mooncake-common/libasio.so" "$p/lib/"
  cp "$dir/src/mooncake-transfer-engine/include/transfer_engine_c.h" "$p/include/"
  touch "$p/.built"
  log "shared $cfg built in $((SECONDS - start)) s: $p"
}

# prepared_dir TOOL...: the source (fetched if it must be), each TOOL
# checked, and the key folder with the patched tree prepared in it, as dir.
prepared_dir() {
  use_src 1
  check_src
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (hack/host-packages.sh install mooncake)"
  done
  dir=$(key_dir)
  mkdir -p "$dir"
  (flock 9 && prepare "$dir") 9>"$dir/.lock"
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case $cmd in
  build)
    prepared_dir cmake patch g++
    [ $# -gt 0 ] || set -- "${CONFIGS[@]}"
    for cfg in "$@"; do
      config_flags "$cfg" >/dev/null
      (flock 9 && build_config "$dir" "$cfg") 9>"$dir/$cfg.lock"
    done
    ;;
  dir)
    [ $# -eq 1 ] || die "usage: $0 dir CONFIG"
    use_src 0
    config_flags "$1" >/dev/null
    echo "$(key_dir)/$1/mooncake-transfer-engine"
    ;;
  module)
    prepared_dir cmake patch g++ "$python"
    [ $# -gt 0 ] || set -- "${CONFIGS[@]}"
    for cfg in "$@"; do
      config_flags "$cfg" >/dev/null
      (flock 9 && build_module "$dir" "$cfg") 9>"$dir/$(module_name "$cfg").lock"
    done
    ;;
  module-dir)
    [ $# -eq 1 ] || die "usage: $0 module-dir CONFIG"
    use_src 0
    config_flags "$1" >/dev/null
    echo "$(key_dir)/$(module_name "$1")"
    ;;
  shared)
    [ $# -le 1 ] || die "usage: $0 shared [CONFIG]"
    cfg=${1:-default}
    config_flags "$cfg" >/dev/null
    prepared_dir cmake patch g++
    (flock 9 && build_shared "$dir" "$cfg") 9>"$dir/shared-$cfg.lock"
    echo "$dir/shared-$cfg-prefix"
    ;;
  shared-prefix)
    [ $# -eq 1 ] || die "usage: $0 shared-prefix CONFIG"
    use_src 0
    config_flags "$1" >/dev/null
    echo "$(key_dir)/shared-$1-prefix"
    ;;
  commit)
    use_src 0
    commit
    ;;
  source)
    how=$(decide) || exit 1
    case $how in tree\ *) src=${how#tree } && check_src ;; esac
    echo "$how"
    ;;
  tree)
    how=$(decide) || exit 1
    case $how in
      tree\ *) src=${how#tree } && check_src && echo "$src" ;;
      *) die "no Mooncake tree yet: hack/mooncake.sh build fetches $TESTED_COMMIT into $fetched" ;;
    esac
    ;;
  tests) printf '%s\n' "${MOONCAKE_TESTS[@]}" ;;
  configs) printf '%s\n' "${CONFIGS[@]}" ;;
  *) die "usage: $0 build [CONFIG...] | dir CONFIG | module [CONFIG...] | module-dir CONFIG | shared [CONFIG] | shared-prefix CONFIG | commit | source | tree | tests | configs" ;;
esac
