#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make cluster-demo: PXN on a real single-node Kubernetes cluster on this
# machine (hack/local-cluster.sh). Brings the cluster up from the cached tools,
# builds and imports the images, installs charts/pxn with helm, shows the
# node's PxnRailMap and its pxn.io/relay, runs pxn-bench's eight ranks in a
# Job whose pod requests pxn.io/relay while a Prometheus on this host scrapes
# pxn-agent, prints the bench table and the PromQL answer of relayed bytes by
# rail, and tears everything down again (also on Ctrl-C or an error).
#
#   hack/cluster-demo.sh [--keep]
#
# --keep leaves the cluster, the chart and the Job in place (stop them with
# hack/local-cluster.sh down). A cluster that was already up is used as is and
# left up; only what the demo installed is removed. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
for arg in "$@"; do
  case $arg in
    --keep) keep=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster-demo: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "cluster-demo: must run as root (it starts containerd and a kubelet)" >&2; exit 2; }

export PXN_CLUSTER_DIR=${PXN_CLUSTER_DIR:-/var/tmp/pxn-local-cluster}
D=$PXN_CLUSTER_DIR
lc=hack/local-cluster.sh
release=pxn
ns=pxn-system
demo_ns=pxn-demo

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
kc() { bash "$lc" kubectl "$@"; }

preexisting=0
[ -f "$D/up" ] && bash "$lc" status >/dev/null 2>&1 && preexisting=1
started=0
t0=$SECONDS

cleanup() {
  local rc=$?
  # A second Ctrl-C must not cut the tear-down short: ignore INT and TERM from
  # here on, in this shell and in the commands it starts.
  trap - EXIT
  trap '' INT TERM
  set +e
  if [ -n "${prom_dir:-}" ] && [ "$keep" = 0 ]; then bash hack/e2e/prometheus.sh stop "$prom_dir"; rm -rf "$prom_dir"; fi
  if [ "$keep" = 1 ]; then
    step "Left up (--keep)"
    echo "  source <(hack/local-cluster.sh env); kubectl get pxnrailmaps"
    [ -z "${prom_dir:-}" ] || echo "  hack/e2e/prometheus.sh query $prom_dir 'sum by (rail) (pxn_relayed_bytes_total)'; stop it: hack/e2e/prometheus.sh stop $prom_dir"
    echo "  stop it with: PXN_CLUSTER_DIR=$D hack/local-cluster.sh down"
  elif [ "$preexisting" = 1 ]; then
    step "Removing what the demo installed (the cluster was up before and stays up)"
    kc delete namespace "$demo_ns" --ignore-not-found --wait=true --timeout=2m >/dev/null 2>&1 || true
    helm_ uninstall "$release" -n "$ns" --wait --timeout 2m >/dev/null 2>&1 || true
  elif [ "$started" = 1 ] || [ -e "$D" ]; then
    step "Tearing the cluster down"
    bash "$lc" down || rc=1
  fi
  [ "$rc" = 0 ] && echo "cluster-demo: done in $((SECONDS - t0)) s" || echo "cluster-demo: FAILED (exit $rc) after $((SECONDS - t0)) s" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "cluster-demo: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

helm_() {
  HELM_CACHE_HOME=$D/helm/cache HELM_CONFIG_HOME=$D/helm/config HELM_DATA_HOME=$D/helm/data \
    "$(hack/tools.sh path helm)" --kubeconfig "$D/pki/admin.kubeconfig" "$@"
}

step "Tools (cached in .tools by hack/tools.sh; built when missing)"
hack/tools.sh etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd helm

step "A single-node cluster: etcd, kube-apiserver, controller-manager, scheduler, kubelet, containerd"
started=1
if [ "$preexisting" = 1 ]; then
  echo "using the cluster already up in $D; re-importing the images"
  bash "$lc" images
else
  bash "$lc" up
fi
# shellcheck disable=SC1091
source "$D/env"
node=$PXN_CLUSTER_NODE
kc get nodes -o wide

step "helm install $release charts/pxn (values: hack/e2e/values.yaml + the cluster's)"
helm_ upgrade --install "$release" charts/pxn -n "$ns" --create-namespace \
  -f hack/e2e/values.yaml -f "$D/helm-values.yaml" --wait --timeout 3m
kc -n "$ns" get pods -o wide

step "kubectl get pxnrailmaps (the agent read the bundled 8-GPU sysfs fixture)"
for _ in $(seq 1 120); do
  [ "$(kc get pxnrailmap "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break
  sleep 1
done
kc get pxnrailmaps
echo
echo "rail map (MC_PXN_RAIL_MAP of pods on $node):"
kc get pxnrailmap "$node" -o 'jsonpath={.status.railMap}'
echo

step "The node's pxn.io/relay (the device plugin registered with the kubelet)"
for _ in $(seq 1 120); do
  [ -n "$(kc get node "$node" -o 'jsonpath={.status.allocatable.pxn\.io/relay}')" ] && break
  sleep 1
done
kc get node "$node" -o 'custom-columns=NODE:.metadata.name,CAPACITY:.status.capacity.pxn\.io/relay,ALLOCATABLE:.status.allocatable.pxn\.io/relay'

step "The node's relay device for Dynamic Resource Allocation (pxn-dra-plugin; docs/dra.md)"
for _ in $(seq 1 120); do
  [ -n "$(kc get resourceslices --field-selector "spec.nodeName=$node,spec.driver=pxn.io" -o name 2>/dev/null)" ] && break
  sleep 1
done
kc get deviceclass relay.pxn.io
kc get resourceslices --field-selector "spec.nodeName=$node,spec.driver=pxn.io" \
  -o 'custom-columns=SLICE:.metadata.name,DEVICE:.spec.devices[0].name,SHARED:.spec.devices[0].allowMultipleAllocations,RAILS:.spec.devices[0].attributes.rails.int,READY:.spec.devices[0].attributes.railsReady.bool'
echo
echo "A pod gets it through a ResourceClaim of class relay.pxn.io; the pods that share one claim are one group."

step "A Prometheus on this host scrapes pxn-agent at the address of its metrics Service (hack/e2e/prometheus.sh)"
target=""
for _ in $(seq 1 60); do
  target=$(kc -n "$ns" get endpointslices -l "kubernetes.io/service-name=$release-agent-metrics" \
    -o 'jsonpath={.items[0].endpoints[0].addresses[0]}' 2>/dev/null || true)
  [ -n "$target" ] && break
  sleep 1
done
[ -n "$target" ] || { echo "cluster-demo: the agent's metrics Service lists no address" >&2; exit 1; }
prom_dir=$D/prometheus
bash hack/e2e/prometheus.sh stop "$prom_dir"
bash hack/e2e/prometheus.sh start "$prom_dir" "$target:9640"

step "A Job requesting pxn.io/relay: 1 runs pxn-bench run --device host --ranks 8 --bytes 64MiB --pattern cross-rail --hold-after 30s"
cat <<'TEXT'
The device plugin gives the pod the node's rail map (MC_PXN_RAIL_MAP, above)
and its group's registry folder. pxn-bench's rank r stands for GPU r of the
node, with that GPU's HCA and rail from the map (rank 1: mlx5_2 on rail1), and
writes 64 MiB to a remote buffer on rail r+1 through rank r+1's staging ring;
a second phase sends the same writes direct (MC_PXN_ENABLE=0). RELAYED is what
went through a peer on the target's rail, FALLBACK and FAILED are 0 in a
healthy run, VERIFIED says every target checked every byte. Host memory stands
in for GPU memory and a TCP hop on loopback for RDMA: RATIO (PXN GB/s over
direct GB/s) is the price of the stand-in's extra CPU copy on this machine,
well below 1, not a measurement of the engine on GPUs (docs/benchmarks.md).
TEXT
kc create namespace "$demo_ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
kc -n "$demo_ns" delete job pxn-bench --ignore-not-found --wait=true >/dev/null
sed "s|image: pxn:local|image: $PXN_CLUSTER_IMAGE|" hack/e2e/bench-job.yaml | kc apply -f -
# The ranks' registry is in the job's group folder, which the device plugin
# mounted at MC_PXN_REGISTRY_ROOT (/run/pxn); on the host it is
# <shmDir>/groups/<key>. pxn-agent inspect runs inside the pod (there its
# ranks are judged by pid; from the host, by heartbeat), once the transfer is
# over and while --hold-after keeps the ranks registered, so that it shows
# their counters.
inspect_job() {
  local dir reg p
  dir=$(ls -d "$PXN_CLUSTER_SHM_DIR"/groups/*/pxn-bench-registry-*/mooncake-pxn-*-bench-pxn 2>/dev/null | head -1 || true)
  [ -n "$dir" ] || return 0
  reg=$(basename "$(dirname "$dir")")
  p=$(kc -n "$demo_ns" get pods -l job-name=pxn-bench -o 'jsonpath={.items[0].metadata.name}' 2>/dev/null || true)
  echo "--- the ranks' registry: on the host $(dirname "$(dirname "$dir")"), in the pod /run/pxn"
  echo "--- kubectl exec $p -- pxn-agent inspect --root /run/pxn/$reg"
  kc -n "$demo_ns" exec "$p" -- /usr/local/bin/pxn-agent inspect --root "/run/pxn/$reg" 2>&1 || true
}
# Prometheus is asked while the ranks run: a rank's series end with it. The
# Job's --hold-after keeps them registered for a while after the transfer.
query='sum by (rail) (pxn_relayed_bytes_total)'
answer="" prom_fallback="" inspected=""
status=""
for _ in $(seq 1 600); do
  status=$(kc -n "$demo_ns" get job pxn-bench -o 'jsonpath={range .status.conditions[?(@.status=="True")]}{.type} {end}')
  case $status in *Complete* | *Failed*) break ;; esac
  # Once every rail shows at least the Job's 64 MiB, the transfer is over.
  if [ -z "$answer" ]; then
    out=$(bash hack/e2e/prometheus.sh query "$prom_dir" "$query >= 67108864" 2>/dev/null || true)
    if [ "$(grep -c '=> ' <<<"$out" || true)" -ge 8 ]; then
      answer=$(bash hack/e2e/prometheus.sh query "$prom_dir" "$query" 2>/dev/null || true)
      prom_fallback=$(bash hack/e2e/prometheus.sh query "$prom_dir" 'sum(pxn_fallback_bytes_total)' 2>/dev/null || true)
      inspected=$(inspect_job)
    fi
  fi
  sleep 1
done
pod=$(kc -n "$demo_ns" get pods -l job-name=pxn-bench -o 'jsonpath={.items[0].metadata.name}')
echo "pod $pod: $(kc -n "$demo_ns" get pod "$pod" -o 'jsonpath={.status.phase}')"
echo
logs=$(kc -n "$demo_ns" logs "$pod")
echo "$logs"
case $status in
  *Complete*) ;;
  *)
    echo "cluster-demo: the Job did not complete (conditions: ${status:-none})" >&2
    kc -n "$demo_ns" describe pod "$pod" >&2 || true
    exit 1
    ;;
esac

# The first row under the header: relayed > 0, fallback 0, failed 0, verified.
read -r relayed fallback failed verified < <(echo "$logs" | awk -F'  +' '
  /^SCENARIO/ { getline; print $8, $9, $11, $12; exit }')
echo
echo "relayed=${relayed:-?} fallback=${fallback:-?} failed=${failed:-?} verified=${verified:-?}"
if [ -z "${relayed:-}" ] || [ "$relayed" = 0 ] || [ "$fallback" != 0 ] || [ "$failed" != 0 ] || [ "$verified" != true ]; then
  echo "cluster-demo: want relayed > 0, fallback 0, failed 0, verified true" >&2
  exit 1
fi

step "pxn-agent inspect in the pod, after the transfer, while the ranks were still registered"
echo "${inspected:-  (not taken: Prometheus did not see the transfer end while the ranks were registered)}"

step "PromQL, asked of the Prometheus scraping pxn-agent while the ranks ran"
echo "$query"
echo "${answer:-  (no answer with 64 MiB relayed on all 8 rails)}"
echo "sum(pxn_fallback_bytes_total)"
echo "${prom_fallback:-  (not asked)}"
if [ -z "$answer" ] || [ "$(grep -c '=> [1-9]' <<<"$answer" || true)" -lt 8 ] || ! grep -q '=> 0 ' <<<"$prom_fallback"; then
  echo "cluster-demo: want relayed bytes above zero on all 8 rails and fallback 0 in Prometheus" >&2
  exit 1
fi
echo
echo "OK: every cross-rail write was relayed through a peer rank on the target's rail, none fell back, every byte verified;"
echo "Prometheus saw the relayed bytes of every rail through pxn-agent."
