#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The recipe inside a kit made by hack/mooncake-cuda-kit.sh: builds Mooncake's
# Python module mooncake.engine with PXN's transport (default configuration,
# USE_CUDA=ON) against the kit's extracted Debian packages, without network,
# and packs it as a wheel that carries those libraries beside the module.
#
#   ./kit-build.sh [BUILD]     BUILD default ./build; the wheel goes to BUILD/wheel
#
# PYTHON: the interpreter the module is for (default python3; it needs its
# headers, and build, setuptools and wheel). CUDA: ON (default) or OFF.
# JOBS: parallel compile jobs (default: the number of CPUs).
set -euo pipefail

kit=$(cd "$(dirname "$0")" && pwd)
mkdir -p "${1:-$kit/build}"
b=$(cd "${1:-$kit/build}" && pwd)
python=${PYTHON:-python3}
cuda=${CUDA:-ON}
jobs=${JOBS:-$(nproc)}
deps=$kit/deps/usr
arch=$(gcc -print-multiarch 2>/dev/null || true)
arch=${arch:-x86_64-linux-gnu}
libdir=$deps/lib/$arch
# Debian puts some libraries (libnl) in /lib rather than /usr/lib.
rootlibdir=$kit/deps/lib/$arch

die() { echo "kit-build: $*" >&2; exit 1; }

for tool in cmake c++ gcc objdump "$python"; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
[ "$cuda" = OFF ] || command -v nvcc >/dev/null 2>&1 || die "nvcc not found (CUDA=ON); put the CUDA toolkit's bin in PATH"
inc=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$inc/Python.h" ] || die "$python has no C headers ($inc/Python.h): the module is compiled against them"
"$python" -c 'import build, setuptools, wheel' 2>/dev/null || die "$python lacks build, setuptools or wheel"
[ -d "$libdir" ] || die "no $libdir: the kit's packages are for another architecture"

# yalantinglibs is headers only: installed into a prefix of the build.
cmake -S "$kit/mooncake/extern/yalantinglibs" -B "$b/ylt" -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF \
  -DBUILD_UNIT_TESTS=OFF -DINSTALL_STANDALONE=OFF -DCMAKE_INSTALL_PREFIX="$b/ylt-prefix" >"$b/ylt.log"
cmake --build "$b/ylt" >>"$b/ylt.log"
cmake --install "$b/ylt" >>"$b/ylt.log"

# The packages' .pc files and CMake configs name /usr: the sysroot moves
# pkg-config's paths, and the prefix path finds the configs in the kit.
export PKG_CONFIG_LIBDIR=$libdir/pkgconfig:$deps/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$kit/deps
flags="-isystem $deps/include"
# gflags, libunwind and libnl are needed by glog and libibverbs, not by the module:
# naming them makes the module need them too, so that its RUNPATH ($ORIGIN)
# loads the wheel's copies before glog and libibverbs look for them.
ld="-L$libdir -L$rootlibdir -Wl,-rpath-link,$libdir:$rootlibdir"
mod_ld="$ld -Wl,--no-as-needed -lgflags -lunwind -lnl-3 -lnl-route-3 -Wl,--as-needed"
cmake -S "$kit/pxn/integrations/mooncake/cmake" -B "$b/engine" \
  -DMOONCAKE_SOURCE_DIR="$kit/mooncake" -DUSE_PXN=ON -DPXN_SOURCE_DIR="$kit/pxn" \
  -DCMAKE_BUILD_TYPE=Release -DENABLE_DEBUG_SYMBOLS=OFF \
  -DCMAKE_PREFIX_PATH="$b/ylt-prefix;$deps" -DASIO_INCLUDE_DIR="$b/ylt-prefix/include" \
  -DCMAKE_LIBRARY_PATH="$libdir;$rootlibdir" -DCMAKE_INCLUDE_PATH="$deps/include" \
  -DJSONCPP_INCLUDE_DIR="$deps/include/jsoncpp" -DJSONCPP_LIBRARY="$libdir/libjsoncpp.so" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$ld" -DCMAKE_SHARED_LINKER_FLAGS="$ld" -DCMAKE_MODULE_LINKER_FLAGS="$mod_ld" \
  -DPython3_EXECUTABLE="$(command -v "$python")" -DPYTHON_EXECUTABLE="$(command -v "$python")" \
  -DUSE_CUDA="$cuda" -DUSE_TENT=OFF -DUSE_ETCD=OFF -DUSE_REDIS=OFF -DUSE_HTTP=OFF -DUSE_TCP=ON \
  -DWITH_METRICS=ON -DUSE_EVENT_DRIVEN_COMPLETION=OFF \
  -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON >"$b/engine.log" 2>&1 ||
  { tail -40 "$b/engine.log" >&2; die "configuring failed ($b/engine.log)"; }
cmake --build "$b/engine" -j"$jobs" --target engine >>"$b/engine.log" 2>&1 ||
  { grep -B2 -A12 -m3 'error' "$b/engine.log" >&2 || tail -40 "$b/engine.log" >&2; die "building failed ($b/engine.log)"; }

module=$(find "$b/engine/mooncake-integration" -maxdepth 1 -name 'engine*.so' | head -1)
[ -n "$module" ] || die "no engine*.so in $b/engine/mooncake-integration"
stage=$b/stage
rm -rf "$stage" "$b/wheel"
mkdir -p "$stage/mooncake"
cp "$kit/pxn/integrations/mooncake/wheel/pyproject.toml" "$kit/pxn/integrations/mooncake/wheel/setup.py" "$stage/"
cp "$kit/mooncake/LICENSE-APACHE" "$stage/LICENSE-APACHE"
cp "$kit/pxn/LICENSE" "$stage/LICENSE"
cp "$kit/mooncake/mooncake-wheel/mooncake/__init__.py" "$kit/mooncake/mooncake-wheel/mooncake/buffer_pool.py" \
  "$kit/mooncake/mooncake-integration/shared_segment.py" "$stage/mooncake/"
cp "$module" "$b/engine/mooncake-common/libasio.so" "$kit/libpxn.so" "$stage/mooncake/"
# The kit's libraries the module loads, by the names it asks for.
for lib in $(objdump -p "$module" | awk '$1 == "NEEDED" {print $2}'); do
  for dir in "$libdir" "$rootlibdir"; do
    if [ -e "$dir/$lib" ]; then
      cp -L "$dir/$lib" "$stage/mooncake/"
      break
    fi
  done
done
commit=$(sed -n 's/^mooncake //p' "$kit/MANIFEST")
label="pxn.$(tr -c 'A-Za-z0-9.\n' '.' <"$kit/pxn/VERSION").mc${commit:0:12}"
[ "$cuda" = OFF ] || label+=".cuda"
PXN_WHEEL_VERSION="0+$label" "$python" -m build --wheel --no-isolation --outdir "$b/wheel" "$stage" >"$b/wheel.log" 2>&1 ||
  { tail -30 "$b/wheel.log" >&2; die "packing the wheel failed ($b/wheel.log)"; }
ls "$b"/wheel/*.whl
