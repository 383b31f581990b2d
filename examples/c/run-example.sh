#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs N ranks of pxn_example (default 2) on one host and releases them only
# when all have printed DONE, so that no rank withdraws while another still
# relays through it. Usage: run-example.sh [BUILD_DIR] [N]
# BUILD_DIR holds libpxn.so and pxn_example (see docs/c-abi.md).
# PXN_EXAMPLE_PIDNS=1 starts each rank in a PID namespace of its own, half a
# second apart, as ranks of separate pods (needs root and unshare).
set -euo pipefail

build=${1:-.}
n=${2:-2}
work=$(mktemp -d /dev/shm/pxn-example.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

railmap="{"
for ((i = 0; i < n; i++)); do
	railmap+="\"mlx5_$i\":\"rail$i\",\"rmlx5_$i\":\"rail$i\""
	((i < n - 1)) && railmap+=","
done
railmap+="}"

export MC_PXN_ENABLE=${MC_PXN_ENABLE:-1}
export MC_PXN_GROUP_ID=${MC_PXN_GROUP_ID:-example}
export MC_PXN_REGISTRY_ROOT=$work
export MC_PXN_RAIL_MAP=$railmap
mkdir "$work/targets"

for ((i = 0; i < n; i++)); do
	mkfifo "$work/go$i"
	wrap=()
	if [[ ${PXN_EXAMPLE_PIDNS:-0} == 1 ]]; then
		wrap=(unshare --pid --fork --mount-proc --kill-child)
		((i > 0)) && sleep 0.5
	fi
	"${wrap[@]}" "$build/pxn_example" --rank "$i" --ranks "$n" --dir "$work/targets" \
		<"$work/go$i" >"$work/out$i" &
	pids[i]=$!
	# Hold the fifo open for writing so the rank's stdin stays open.
	exec {fd}>"$work/go$i"
	fds[i]=$fd
done

for ((i = 0; i < n; i++)); do
	until grep -q '^DONE' "$work/out$i"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			cat "$work/out$i"
			echo "rank $i exited before DONE" >&2
			exit 1
		fi
		sleep 0.1
	done
done
for ((i = 0; i < n; i++)); do
	echo >&"${fds[i]}"
done
status=0
for pid in "${pids[@]}"; do
	wait "$pid" || status=1
done
cat "$work"/out*
exit $status
