#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# NIXL's Mooncake backend through PXN on one node, over the link seam (the
# project's emulated NIC in place of Mooncake's RdmaTransport): four NIXL
# agents, each a process with its own Mooncake engine.
#
#   target      NIC mlx5_1, PXN off (the remote side: no rail map)
#   relay       NIC mlx5_1 (rail1, the target's rail), a PXN rank
#   initiator0  NIC mlx5_0 (rail0), a PXN rank, its buffers seen as GPU memory
#   initiator1  NIC mlx5_2 (rail2), the same
#
# The ranks share a PXN group (MC_PXN_GROUP_ID) and a rail map
# (MC_PXN_RAIL_MAP); each initiator writes two write lists of seven
# descriptors (342 KiB each) with a notification to the target, which checks
# every byte of its buffer. Then pxn-agent inspect reads the ranks' counters:
# every byte written must have gone through the relay (relayed_bytes on the
# initiators, forwarded_bytes on the relay) and none by a fallback.
#
#   integrations/nixl/test/run.sh PROGRAM SEAM_DIR PLUGIN_DIR PXN_BIN [OUT]
#     PROGRAM     nixl_pxn (integrations/nixl/test/nixl_pxn.cpp, built)
#     SEAM_DIR    libtransfer_engine.so linked with the seam, and libasio.so
#                 (hack/nixl.sh seam)
#     PLUGIN_DIR  the folder of NIXL's libplugin_Mooncake.so (NIXL_PLUGIN_DIR)
#     PXN_BIN     the folder of libpxn.so and pxn-agent (make build)
#     OUT         the run's folder (default: a new temporary one), kept
#
# LD_LIBRARY_PATH is set to SEAM_DIR and PXN_BIN ahead of what it held (NIXL's
# own libraries: hack/nixl.sh env's NIXL_LIBPATH). Exit 0 only when every
# process succeeded, every byte matched and the counters are as above.
set -euo pipefail

die() { echo "nixl-test: $*" >&2; exit 1; }

[ $# -ge 4 ] || die "usage: $0 PROGRAM SEAM_DIR PLUGIN_DIR PXN_BIN [OUT]"
prog=$(realpath "$1")
seam=$(realpath "$2")
plugins=$(realpath "$3")
bin=$(realpath "$4")
[ -x "$prog" ] || die "no program $prog (make nixl-test builds it)"
[ -f "$seam/libtransfer_engine.so" ] || die "no libtransfer_engine.so in $seam (hack/nixl.sh seam)"
[ -f "$plugins/libplugin_Mooncake.so" ] || die "no libplugin_Mooncake.so in $plugins (hack/nixl.sh build)"
[ -f "$bin/libpxn.so" ] || die "no libpxn.so in $bin (make libpxn)"
[ -x "$bin/pxn-agent" ] || die "no pxn-agent in $bin (make build)"
command -v python3 >/dev/null 2>&1 || die "python3 not found: the counters are read with it"
out=${5:-$(mktemp -d -t pxn-nixl.XXXXXX)}
rm -rf "$out"
mkdir -p "$out/peers" "$out/registry"
out=$(realpath "$out")

export NIXL_PLUGIN_DIR=$plugins
export LD_LIBRARY_PATH=$seam:$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The Mooncake backend's address for its P2P handshake; the seam's peers.
export NIXL_MOONCAKE_IP_ADDR=127.0.0.1 SEAM_PEERS=$out/peers MC_FORCE_HCA=1
export T_HOLD_S=${T_HOLD_S:-5}
initiators=2

for n in 0 1 2; do
  echo "{\"cpu:0\": [[\"mlx5_$n\"], []], \"cuda:0\": [[\"mlx5_$n\"], []]}" >"$out/topo$n.json"
done
echo '{"cpu:0": [["mlx5_1"], []]}' >"$out/topoT.json"
pxn=(MC_PXN_ENABLE=1 MC_PXN_GROUP_ID=nixl-test MC_PXN_REGISTRY_ROOT="$out/registry"
  'MC_PXN_RAIL_MAP={"mlx5_0":"rail0","mlx5_1":"rail1","mlx5_2":"rail2"}'
  SEAM_WILDCARD_LOCATION=cuda:0)

pids=()
start() { # NAME ENV... -- ARGS...
  local name=$1
  shift
  local -a e=()
  while [ "$1" != -- ]; do e+=("$1"); shift; done
  shift
  env "${e[@]}" timeout 180 "$prog" "$@" >"$out/$name.log" 2>&1 &
  pids+=("$name:$!")
}

start target MC_PXN_ENABLE=0 MC_CUSTOM_TOPO_JSON="$out/topoT.json" -- target "$out" $initiators
start relay "${pxn[@]}" MC_CUSTOM_TOPO_JSON="$out/topo1.json" -- relay "$out"
sleep 1
start initiator0 "${pxn[@]}" MC_CUSTOM_TOPO_JSON="$out/topo0.json" -- initiator "$out" 0
start initiator1 "${pxn[@]}" MC_CUSTOM_TOPO_JSON="$out/topo2.json" -- initiator "$out" 1

# Once the target checked its buffer and both initiators are done, the ranks
# are still up (T_HOLD_S): read their counters, then let everyone go.
for _ in $(seq 1200); do
  [ -f "$out/target.checked.ready" ] && [ -f "$out/initiator0.done.ready" ] &&
    [ -f "$out/initiator1.done.ready" ] && break
  alive=0
  for p in "${pids[@]}"; do kill -0 "${p#*:}" 2>/dev/null && alive=1; done
  [ $alive = 1 ] || break
  sleep 0.1
done
# counters: the group's ranks and their sums from a fresh pxn-agent inspect,
# "RANKS RELAYED FORWARDED DIRECT FALLBACK PIECES"; fails when it read none.
counters() {
  "$bin/pxn-agent" inspect --root "$out/registry" -o json >"$out/inspect.json" 2>"$out/inspect.err" || return 1
  python3 - "$out/inspect.json" <<'EOF2'
import json, sys
ranks = [r for g in json.load(open(sys.argv[1])) for r in g.get("ranks") or []]
if not ranks:
    sys.exit(1)
s = [r["stats"] for r in ranks]
print(len(ranks), sum(x["relayed_bytes"] for x in s), sum(x["forwarded_bytes"] for x in s),
      sum(x["direct_bytes"] for x in s), sum(sum(x["fallback_bytes"].values()) for x in s),
      sum(x["relayed_pieces"] for x in s))
EOF2
}

# Each rank publishes its counters at its own heartbeat, so they trail the
# writes: read them until the relayed and forwarded bytes account for what
# the initiators wrote, or INSPECT_TIMEOUT_S (default 30) passes.
written=$(sed -n 's/^target: checked [0-9]* bytes (\([0-9]*\) written.*/\1/p' "$out/target.log")
got=""
for _ in $(seq $((${INSPECT_TIMEOUT_S:-30} * 5))); do
  if c=$(counters); then
    got=$c
    read -r _ relayed forwarded _ <<<"$got"
    [ -n "$written" ] && [ "$relayed" = "$written" ] && [ "$forwarded" = "$written" ] && break
  fi
  sleep 0.2
done
echo 1 >"$out/all-done"
echo 1 >"$out/all-done.ready"

fail=0
for p in "${pids[@]}"; do
  name=${p%%:*}
  rc=0
  wait "${p#*:}" || rc=$?
  echo "nixl-test: $name exit $rc"
  grep -h '^\(target\|relay\|initiator[0-9]\): ' "$out/$name.log" | sed 's/^/  /' || true
  [ $rc = 0 ] || { fail=1; tail -15 "$out/$name.log" | sed 's/^/  | /' >&2; }
done

# The counters: sums over the group's ranks, as last read.
if [ -n "$got" ]; then
  read -r ranks relayed forwarded direct fallback pieces <<<"$got"
  echo "nixl-test: counters (pxn-agent inspect, $ranks ranks): relayed_bytes=$relayed" \
    "relayed_pieces=$pieces forwarded_bytes=$forwarded direct_bytes=$direct fallback_bytes=$fallback"
  [ -n "$written" ] || { echo "nixl-test: the target reported no check" >&2; fail=1; }
  [ "$ranks" = 3 ] || { echo "nixl-test: want 3 ranks in the group, inspect saw $ranks" >&2; fail=1; }
  [ "$relayed" -gt 0 ] 2>/dev/null || { echo "nixl-test: nothing was relayed" >&2; fail=1; }
  [ "$relayed" = "$written" ] || { echo "nixl-test: relayed $relayed bytes, the initiators wrote $written" >&2; fail=1; }
  [ "$forwarded" = "$written" ] || { echo "nixl-test: the relay forwarded $forwarded bytes, the initiators wrote $written" >&2; fail=1; }
  [ "$fallback" = 0 ] || { echo "nixl-test: $fallback bytes fell back" >&2; fail=1; }
else
  echo "nixl-test: pxn-agent inspect read no group ($out/inspect.err)" >&2
  fail=1
fi

if [ $fail = 0 ]; then
  echo "nixl-test: PASS ($written bytes written through PXN and checked; logs in $out)"
else
  echo "nixl-test: FAIL (logs in $out)" >&2
  exit 1
fi
