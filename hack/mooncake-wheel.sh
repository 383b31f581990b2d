#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs Mooncake's Python module mooncake.engine, built with PXN's transport
# inside it (hack/mooncake.sh module), into a wheel laid out as Mooncake's
# own: mooncake/engine*.so, libasio.so beside it, and libpxn.so beside both,
# where the transport's dlopen finds it through engine.so's RUNPATH $ORIGIN.
# The packing is setuptools through python3 -m build
# (integrations/mooncake/wheel/).
#
#   hack/mooncake-wheel.sh build [CONFIG...]   build the module (cached, see
#                                              hack/mooncake.sh) and pack one
#                                              wheel per configuration
#                                              (default: every configuration)
#   hack/mooncake-wheel.sh path CONFIG         print CONFIG's wheel; exit 1
#                                              when there is none
#   hack/mooncake-wheel.sh version CONFIG      print the version a wheel of
#                                              CONFIG gets
#   hack/mooncake-wheel.sh install WHEEL DIR   a virtual environment at DIR
#                                              that sees the system's packages
#                                              (pytest), WHEEL installed into
#                                              it by python3 -m installer
#   hack/mooncake-wheel.sh image BASE OUT [CONFIG]
#                                              an OCI image archive OUT: the
#                                              CONFIG wheel (default: default)
#                                              unpacked into PYTHON_SITE and
#                                              libpxn.so in /usr/local/lib, as
#                                              one layer over BASE, a one-image
#                                              OCI archive (hack/image -base)
#
# PYTHON_SITE: the base image's site-packages folder (default
# /usr/local/lib/python3.X/dist-packages, X from the wheel's tag: where
# Debian's and Ubuntu's Python install). IMAGE_NAME: the image's name
# (default pxn-mooncake:VERSION, + written as -).
#
# The version is Mooncake's (MOONCAKE_VERSION, else the tree's
# mooncake-wheel/pyproject.toml, else 0) with a local label naming PXN's
# release, the Mooncake commit, a configuration other than the default and
# the hash of MOONCAKE_CMAKE_ARGS when given (hack/mooncake.sh):
# 0+pxn.0.1.0.mc3b5a59413395, 0+pxn.0.1.0.mc3b5a59413395.event,
# 0+pxn.0.1.0.mc3b5a59413395.x1a2b3c4d.
#
# LIBPXN: the libpxn.so to ship (make mooncake-wheel builds it). WHEEL_DIR:
# where wheels go (default _output/mooncake-wheel). MOONCAKE_TREE,
# PXN_TOOLS_DIR, JOBS: as hack/mooncake.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out_dir=${WHEEL_DIR:-$root/_output/mooncake-wheel}
src=
python=${PYTHON:-/usr/bin/python3}
export PYTHON=$python

log() { echo "mooncake-wheel: $*" >&2; }
die() { echo "mooncake-wheel: $*" >&2; exit 1; }

mooncake_version() {
  if [ -n "${MOONCAKE_VERSION:-}" ]; then
    echo "$MOONCAKE_VERSION"
  elif [ -f "$src/mooncake-wheel/pyproject.toml" ]; then
    sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$src/mooncake-wheel/pyproject.toml" | head -1
  else
    echo 0
  fi
}

# use_src: the Mooncake tree hack/mooncake.sh builds from.
use_src() {
  src=$("$root/hack/mooncake.sh" tree) || exit 1
}

# version CONFIG: a PEP 440 version; a local label takes only letters, digits
# and dots.
version() {
  local cfg=$1 commit pxn label extra
  use_src
  commit=$("$root/hack/mooncake.sh" commit)
  pxn=$(tr -c 'A-Za-z0-9.\n' '.' <"$root/VERSION")
  label="pxn.$pxn.mc${commit:0:12}"
  [ "$cfg" = default ] || label+=".$cfg"
  extra=$(basename "$("$root/hack/mooncake.sh" module-dir "$cfg")")
  extra=${extra#"$cfg"}
  label+=${extra//-/.}
  echo "$(mooncake_version)+$label"
}

# pack CONFIG: stages the package from the module's build folder and the
# tree's Python files, and builds the wheel into $out_dir/CONFIG.
pack() {
  local cfg=$1 b stage ver dest
  b=$("$root/hack/mooncake.sh" module-dir "$cfg")
  [ -f "$b/.module-built" ] || die "the module's $cfg build is not in $b"
  ver=$(version "$cfg")
  use_src
  stage=$out_dir/stage-$cfg
  dest=$out_dir/$cfg
  rm -rf "$stage" "$dest"
  mkdir -p "$stage/mooncake" "$dest"
  cp "$root/integrations/mooncake/wheel/pyproject.toml" "$root/integrations/mooncake/wheel/setup.py" "$stage/"
  cp "$src/LICENSE-APACHE" "$stage/LICENSE-APACHE"
  cp "$root/LICENSE" "$stage/LICENSE"
  cp "$src/mooncake-wheel/mooncake/__init__.py" "$src/mooncake-wheel/mooncake/buffer_pool.py" \
    "$src/mooncake-integration/shared_segment.py" "$stage/mooncake/"
  local engine
  engine=$(find "$b/mooncake-integration" -maxdepth 1 -name 'engine*.so' | head -1)
  [ -n "$engine" ] || die "no engine*.so in $b/mooncake-integration"
  cp "$engine" "$b/mooncake-common/libasio.so" "$LIBPXN" "$stage/mooncake/"
  PXN_WHEEL_VERSION=$ver "$python" -m build --wheel --no-isolation --outdir "$dest" "$stage" >"$out_dir/$cfg.log" 2>&1 ||
    { tail -30 "$out_dir/$cfg.log" >&2; die "packing the $cfg wheel failed ($out_dir/$cfg.log)"; }
  rm -rf "$stage"
  log "$cfg: $(ls "$dest"/*.whl)"
}

wheel_path() {
  local w
  w=$(ls "$out_dir/$1"/*.whl 2>/dev/null | head -1)
  [ -n "$w" ] || return 1
  echo "$w"
}

# image BASE OUT CONFIG: see image above. The wheel holds only the package
# and its .dist-info, both of which belong in site-packages.
image() {
  local base out cfg=$3 whl stage tag site name f rel mode
  base=$(realpath "$1")
  out=$(realpath -m "$2")
  whl=$(wheel_path "$cfg") || die "no $cfg wheel in $out_dir/$cfg: run make mooncake-wheel"
  tag=$(basename "$whl" | sed -n 's/.*-cp\([0-9]\)\([0-9]*\)-cp[0-9]*-linux_[a-z0-9_]*\.whl$/\1.\2/p')
  [ -n "$tag" ] || die "$whl: no CPython tag in its name"
  site=${PYTHON_SITE:-/usr/local/lib/python$tag/dist-packages}
  name=${IMAGE_NAME:-pxn-mooncake:$(version "$cfg" | tr '+' '-')}
  stage=$(mktemp -d)
  # shellcheck disable=SC2064 # the folder is removed as it is named now
  trap "rm -rf '$stage'" EXIT
  "$python" -m zipfile -e "$whl" "$stage"
  local -a adds=()
  while IFS= read -r f; do
    rel=${f#"$stage"/}
    mode=0644
    case $rel in *.so) mode=0755 ;; esac
    adds+=(-add "$f:$site/$rel:$mode")
  done < <(find "$stage" -type f | LC_ALL=C sort)
  adds+=(-add "$stage/mooncake/libpxn.so:/usr/local/lib/libpxn.so:0755")
  mkdir -p "$(dirname "$out")"
  (cd "$root" && go run ./hack/image -o "$out" -name "$name" -format oci -base "$base" "${adds[@]}") >&2 ||
    die "packing the image over $base failed"
  log "$out: $name over $base, the wheel in $site"
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case $cmd in
  build)
    [ -n "${LIBPXN:-}" ] || die "LIBPXN is not set: the libpxn.so to ship (make mooncake-wheel builds it)"
    [ -f "$LIBPXN" ] || die "LIBPXN=$LIBPXN: no such file"
    "$python" -c 'import build, setuptools, wheel' 2>/dev/null ||
      die "$python lacks build, setuptools or wheel (hack/host-packages.sh install mooncake)"
    [ $# -gt 0 ] || mapfile -t cfgs < <("$root/hack/mooncake.sh" configs)
    [ $# -eq 0 ] || cfgs=("$@")
    mkdir -p "$out_dir"
    for cfg in "${cfgs[@]}"; do
      start=$SECONDS
      "$root/hack/mooncake.sh" module "$cfg"
      pack "$cfg"
      log "$cfg built and packed in $((SECONDS - start)) s"
    done
    ;;
  path)
    [ $# -eq 1 ] || die "usage: $0 path CONFIG"
    wheel_path "$1" || die "no $1 wheel in $out_dir/$1: run make mooncake-wheel"
    ;;
  version)
    [ $# -eq 1 ] || die "usage: $0 version CONFIG"
    version "$1"
    ;;
  install)
    [ $# -eq 2 ] || die "usage: $0 install WHEEL DIR"
    [ -f "$1" ] || die "no wheel at $1"
    "$python" -m venv --system-site-packages --without-pip "$2"
    "$2/bin/python" -m installer "$1" ||
      die "installing $1 into $2 failed"
    ;;
  image)
    [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 image BASE OUT [CONFIG]"
    [ -f "$1" ] || die "no base image archive at $1"
    image "$1" "$2" "${3:-default}"
    ;;
  *) die "usage: $0 build [CONFIG...] | path CONFIG | version CONFIG | install WHEEL DIR | image BASE OUT [CONFIG]" ;;
esac
