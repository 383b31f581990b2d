#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real single-node Kubernetes cluster on this machine, from the tools that
# hack/tools.sh builds (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl, and containerd 2 with its runc shim and
# ctr) and Debian's runc and CNI plugins (installed when missing by
# hack/host-packages.sh). containerd has CDI on, with the spec folder $D/cdi
# (PXN_CLUSTER_CDI_DIR in the env file). No kube-proxy and no cluster DNS. See
# docs/local-cluster.md.
#
#   hack/local-cluster.sh up        start it (idempotent); builds and imports the images
#   hack/local-cluster.sh down      stop it and undo everything it did (safe to repeat)
#   hack/local-cluster.sh status    what runs; exit 0 only when the node is Ready
#   hack/local-cluster.sh images    rebuild the pause and pxn images and import them
#   hack/local-cluster.sh restart-kubelet   stop the kubelet and start it again
#   hack/local-cluster.sh env       print export lines (KUBECONFIG, ...)
#   hack/local-cluster.sh kubectl ARGS...   kubectl against the cluster
#
# Environment:
#   PXN_CLUSTER_DIR        state folder (default /var/tmp/pxn-local-cluster);
#                          everything the cluster keeps lives under it
#   PXN_CLUSTER_NODE       node name (default pxn-local)
#   PXN_CLUSTER_NODE_IP    node IP (default: source address of the default route)
#   PXN_CLUSTER_API_PORT   kube-apiserver port (default 6443)
#   PXN_CLUSTER_ETCD_PORT  etcd client port (default 23790; peer port +1)
#   PXN_CLUSTER_KUBELET_PORT, PXN_CLUSTER_KUBELET_HEALTHZ_PORT, PXN_CLUSTER_KCM_PORT,
#   PXN_CLUSTER_SCHED_PORT  (defaults 10250, 10248, 10257, 10259)
#   PXN_CLUSTER_IMAGE      pxn image name (default pxn:local)
#   PXN_CLUSTER_INSTALL=0  never install missing packages (hack/host-packages.sh
#                          cluster: runc, CNI, ...); fail instead
#   PXN_CLUSTER_BUILD=0    never build missing tools; fail instead
#   PXN_TOOLS_DIR          tool cache (see hack/tools.sh)
#
# Exit codes of up: 0 ready, 1 error, 2 usage, 3 containerd cannot start or
# cannot run a container on this machine (the reason is printed), 4 a required
# tool or package is missing (with PXN_CLUSTER_BUILD=0 / PXN_CLUSTER_INSTALL=0).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
D=${PXN_CLUSTER_DIR:-/var/tmp/pxn-local-cluster}
NODE=${PXN_CLUSTER_NODE:-pxn-local}
API_PORT=${PXN_CLUSTER_API_PORT:-6443}
ETCD_PORT=${PXN_CLUSTER_ETCD_PORT:-23790}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KUBELET_PORT=${PXN_CLUSTER_KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${PXN_CLUSTER_KUBELET_HEALTHZ_PORT:-10248}
KCM_PORT=${PXN_CLUSTER_KCM_PORT:-10257}
SCHED_PORT=${PXN_CLUSTER_SCHED_PORT:-10259}
IMAGE=${PXN_CLUSTER_IMAGE:-pxn:local}
PAUSE_IMAGE=pause:3.10
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
BRIDGE=cni0
CNI_BIN=/usr/lib/cni
# The kubelet's device plugin folder is compiled in; the other host paths
# below are where the kubelet, containerd and CNI write regardless of flags.
HOST_PATHS=(/var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/pods
  /var/log/containers /var/lib/cni /run/containerd /run/netns)
# Host tmpfs folder for the device plugin's group folders (must be tmpfs).
SHM_DIR=$(basename "$D")
case $SHM_DIR in pxn*) ;; *) SHM_DIR=pxn-$SHM_DIR ;; esac
SHM_DIR=/dev/shm/$SHM_DIR
# The DRA driver's own tmpfs folder: each plugin removes group folders it did
# not make below its own.
DRA_SHM_DIR=$SHM_DIR-dra
CGROUP_ROOT=/sys/fs/cgroup

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit "${2:-1}"; }

tool() { bash "$repo/hack/tools.sh" path "$1"; }
kc() { "$(tool kubectl)" --kubeconfig "$D/pki/admin.kubeconfig" "$@"; }
# ctr would print containerd's deprecation warnings on every call;
# start_containerd logs them once.
CTR=
ctr_() {
  [ -n "$CTR" ] || CTR=$(tool ctr)
  CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1 "$CTR" --address "$D/containerd/containerd.sock" "$@"
}

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it starts containerd and the kubelet)" 2; }

# --- processes ---------------------------------------------------------------

# start NAME BINARY ARGS...: runs BINARY in its own session, output in
# logs/NAME.log, PID in pids/NAME.pid.
start() {
  local name=$1; shift
  mkdir -p "$D/logs" "$D/pids"
  setsid "$@" </dev/null >>"$D/logs/$name.log" 2>&1 &
  echo $! >"$D/pids/$name.pid"
  echo "$1" >"$D/pids/$name.exe"
}

# pid_of NAME: the PID from the PID file when that process still runs the
# binary we started (a recycled PID is not ours).
pid_of() {
  local f=$D/pids/$1.pid pid exe
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && alive "$pid" || return 1
  exe=$(cat "$D/pids/$1.exe" 2>/dev/null || true)
  if [ -n "$exe" ]; then
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -1 | grep -qxF "$exe" || return 1
  fi
  echo "$pid"
}

running() { pid_of "$1" >/dev/null; }

# alive PID: the process exists and is not a zombie waiting for its parent
# (PID 1 of such machines reaps late).
alive() {
  local st
  st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

stop() { # NAME [grace seconds]
  local name=$1 grace=${2:-15} pid i
  pid=$(pid_of "$name") || { rm -f "$D/pids/$name.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    log "$name ($pid) ignored SIGTERM for ${grace}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
  fi
  rm -f "$D/pids/$name.pid"
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.5 s.
wait_for() {
  local secs=$1 what=$2 i; shift 2
  for ((i = 0; i < secs * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

tail_log() { [ -f "$D/logs/$1.log" ] && tail -n "${2:-30}" "$D/logs/$1.log" | sed "s/^/  $1| /" >&2 || true; }

# --- prerequisites -----------------------------------------------------------

ensure_tools() {
  local t missing=()
  for t in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd; do
    [ -x "$(tool "$t")" ] || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${PXN_CLUSTER_BUILD:-1}" = 0 ]; then
    die "tools not built: ${missing[*]} (run: hack/tools.sh ${missing[*]})" 4
  fi
  log "building ${missing[*]} with hack/tools.sh (cached; minutes when cold)"
  bash "$repo/hack/tools.sh" "${missing[@]}"
}

# ensure_packages: hack/host-packages.sh owns the list (make test and CI use
# the same one).
ensure_packages() {
  local out rc=0
  out=$(bash "$repo/hack/host-packages.sh" check cluster) || rc=$?
  [ "$rc" = 0 ] && return 0
  if [ "${PXN_CLUSTER_INSTALL:-1}" = 0 ] || [ "$rc" = 3 ]; then
    die "$(echo "$out" | tr '\n' ' ')(hack/host-packages.sh install cluster)" 4
  fi
  bash "$repo/hack/host-packages.sh" install cluster || die "installing the cluster's packages failed" 4
}

# check_free: what up is about to take must not be someone else's.
check_free() {
  local port name
  for name in API_PORT ETCD_PORT ETCD_PEER_PORT KUBELET_PORT KUBELET_HEALTHZ_PORT KCM_PORT SCHED_PORT; do
    port=${!name}
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
      [ "$name" = ETCD_PEER_PORT ] && name=ETCD_PORT
      die "port $port is in use; stop what holds it or set PXN_CLUSTER_${name}"
    fi
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "a $BRIDGE interface exists already (another cluster on this machine?); delete it (ip link delete $BRIDGE) if it is stale"
  fi
  local sock=/var/lib/kubelet/device-plugins/kubelet.sock
  if [ -S "$sock" ]; then
    # curl exits 7 when nothing listens on the socket.
    local rc=0
    curl -s -m 2 --unix-socket "$sock" http://localhost/ >/dev/null 2>&1 || rc=$?
    [ "$rc" = 7 ] || die "another kubelet serves $sock; this script needs the machine's device plugin folder"
  fi
}

node_ip() {
  if [ -n "${PXN_CLUSTER_NODE_IP:-}" ]; then echo "$PXN_CLUSTER_NODE_IP"; return; fi
  local ip
  ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)
  [ -n "$ip" ] || ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
  [ -n "$ip" ] || die "no global IPv4 address: set PXN_CLUSTER_NODE_IP"
  echo "$ip"
}

# --- what existed before: down removes only what up created ------------------

record_baseline() {
  local p c
  : >"$D/baseline"
  for p in "${HOST_PATHS[@]}" "$SHM_DIR" "$DRA_SHM_DIR"; do
    [ -e "$p" ] && echo "path $p" >>"$D/baseline"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && echo "link $BRIDGE" >>"$D/baseline"
  for p in /run/netns/*; do [ -e "$p" ] && echo "netns $(basename "$p")" >>"$D/baseline"; done
  for c in "$CGROUP_ROOT"/*/; do
    for p in kubepods kubepods.slice; do
      [ -d "$c$p" ] && echo "cgroup $c$p" >>"$D/baseline"
    done
  done
  local ipt t chain
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      for chain in $("$ipt" -w -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
        echo "chain $ipt/$t/$chain" >>"$D/baseline"
      done
    done
  done
  return 0
}

in_baseline() { grep -qxF "$1 $2" "$D/baseline" 2>/dev/null; }

# --- certificates and kubeconfigs --------------------------------------------

# cert NAME CN [O] [SAN]: key and certificate signed by the cluster CA.
cert() {
  local name=$1 cn=$2 o=${3:-} san=${4:-} subj ext
  subj="/CN=$cn"
  [ -n "$o" ] && subj="/O=$o$subj"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$D/pki/$name.key" 2>/dev/null
  openssl req -new -key "$D/pki/$name.key" -subj "$subj" -out "$D/pki/$name.csr" 2>/dev/null
  ext="$D/pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$san" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl x509 -req -in "$D/pki/$name.csr" -CA "$D/pki/ca.crt" -CAkey "$D/pki/ca.key" \
    -CAcreateserial -days 30 -sha256 -extfile "$ext" -out "$D/pki/$name.crt" 2>/dev/null
  rm -f "$D/pki/$name.csr" "$ext"
}

kubeconfig() { # NAME USER
  cat >"$D/pki/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pxn-local
  cluster:
    certificate-authority: $D/pki/ca.crt
    server: https://127.0.0.1:$API_PORT
users:
- name: $2
  user:
    client-certificate: $D/pki/$1.crt
    client-key: $D/pki/$1.key
contexts:
- name: pxn-local
  context: {cluster: pxn-local, user: $2}
current-context: pxn-local
EOF
}

make_pki() {
  local ip=$1
  mkdir -p "$D/pki"
  chmod 700 "$D/pki"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$D/pki/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$D/pki/ca.key" -subj "/CN=pxn-local-ca" -days 30 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$D/pki/ca.crt" 2>/dev/null
  cert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$ip,IP:$SERVICE_IP"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin pxn-local-admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kubelet-client "system:node:$NODE" system:nodes
  cert kubelet "$NODE" "" "DNS:$NODE,DNS:localhost,IP:$ip,IP:127.0.0.1"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$D/pki/sa.key" 2>/dev/null
  openssl pkey -in "$D/pki/sa.key" -pubout -out "$D/pki/sa.pub" 2>/dev/null
  kubeconfig admin pxn-local-admin
  kubeconfig controller-manager system:kube-controller-manager
  kubeconfig scheduler system:kube-scheduler
  kubeconfig kubelet-client "system:node:$NODE"
  # Readable for the CA certificate only; keys stay 0600.
  chmod 600 "$D"/pki/*.key
}

# --- containerd ----------------------------------------------------------------

write_containerd_config() {
  mkdir -p "$D/containerd" "$D/cni/net.d" "$D/cdi"
  cat >"$D/containerd/config.toml" <<EOF
version = 4
root = "$D/containerd/root"
state = "$D/containerd/state"

[debug]
  level = "info"

[plugins.'io.containerd.server.v1.grpc']
  address = "$D/containerd/containerd.sock"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "$D/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "docker.io/library/$PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # The shell lacks CAP_SYS_RESOURCE on such machines: without this, sandbox
  # creation fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  # Pod network namespaces under the state folder, not /run/netns.
  netns_mounts_under_state_dir = true
  # This cluster's CDI specs only (a DRA driver writes its specs here).
  cdi_spec_dirs = ["$D/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$D/containerd/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$D/cni/net.d"
    max_conf_num = 1
EOF
  cat >"$D/cni/net.d/10-pxn-local.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pxn-local",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$D/cni/ipam"
      }
    }
  ]
}
EOF
}

# containerd_smoke: runs the pause image once through runc, so that "containerd
# cannot run containers here" is found now, with runc's own error.
containerd_smoke() {
  local id=pxn-local-smoke out
  ctr_ -n pxn-smoke containers rm "$id" >/dev/null 2>&1 || true
  if ! out=$(ctr_ -n pxn-smoke images import --digests "$D/images/pause.tar" 2>&1); then
    echo "ctr images import: $out"; return 1
  fi
  if ! out=$(ctr_ -n pxn-smoke run -d --cgroup "/$id" "docker.io/library/$PAUSE_IMAGE" "$id" 2>&1); then
    ctr_ -n pxn-smoke containers rm "$id" >/dev/null 2>&1 || true
    echo "ctr run (runc) failed: $out"; return 1
  fi
  sleep 0.3
  ctr_ -n pxn-smoke tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  local i
  for ((i = 0; i < 50; i++)); do
    ctr_ -n pxn-smoke tasks delete "$id" >/dev/null 2>&1 && break
    sleep 0.1
  done
  ctr_ -n pxn-smoke containers rm "$id" >/dev/null 2>&1 || true
  ctr_ -n pxn-smoke images rm "docker.io/library/$PAUSE_IMAGE" >/dev/null 2>&1 || true
  ctr_ namespaces rm pxn-smoke >/dev/null 2>&1 || true
  return 0
}

start_containerd() {
  write_containerd_config
  # Its own shim first in PATH: containerd looks the shim up there, and a
  # distribution's older containerd-shim-runc-v2 may be installed too. runc
  # comes from the machine.
  local bin dir; bin=$(tool containerd); dir=$(dirname "$bin")
  local PATH="$dir:$PATH"
  start containerd "$bin" --config "$D/containerd/config.toml"
  local i ok=0
  for ((i = 0; i < 60; i++)); do
    if ctr_ version >/dev/null 2>&1; then ok=1; break; fi
    running containerd || break
    sleep 0.5
  done
  if [ "$ok" = 0 ]; then
    log "containerd did not start; its log:"
    tail_log containerd 20
    echo "containerd did not start: $({ grep -iE 'level=(error|fatal)|error' "$D/logs/containerd.log" || tail -n1 "$D/logs/containerd.log"; } | tail -1)" >"$D/containerd-failure"
    return 3
  fi
  local why
  if ! why=$(containerd_smoke); then
    log "containerd cannot run a container: $why"
    echo "containerd cannot run a container: $why" >"$D/containerd-failure"
    return 3
  fi
  local dep
  dep=$(ctr_ deprecations list 2>/dev/null | awk 'NR > 1 {print $1}' | paste -sd' ')
  [ -z "$dep" ] || log "containerd deprecations (ctr deprecations list): $dep"
  return 0
}

# --- images ----------------------------------------------------------------------

build_images() { # [pause-only]
  mkdir -p "$D/images"
  if [ "${1:-}" = pause-only ]; then
    (cd "$repo" && go run ./hack/image -o "$D/images/pause.tar" -name "$PAUSE_IMAGE" -pause)
  else
    log "building images $IMAGE and $PAUSE_IMAGE (hack/image/build.sh)"
    IMAGE=$IMAGE PAUSE_IMAGE=$PAUSE_IMAGE bash "$repo/hack/image/build.sh" "$D/images" >&2
  fi
}

import_images() {
  local t
  for t in "$@"; do
    ctr_ -n k8s.io images import "$D/images/$t.tar" >&2
  done
}

# --- control plane and kubelet ---------------------------------------------------

start_etcd() {
  start etcd "$(tool etcd)" --name "$NODE" --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "$NODE=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes 2147483648 --log-level warn
  wait_for 60 etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health" ||
    { tail_log etcd; die "etcd did not become healthy on port $ETCD_PORT"; }
}

start_apiserver() {
  local ip=$1
  start kube-apiserver "$(tool kube-apiserver)" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 0.0.0.0 --secure-port "$API_PORT" --advertise-address "$ip" \
    --tls-cert-file "$D/pki/apiserver.crt" --tls-private-key-file "$D/pki/apiserver.key" \
    --client-ca-file "$D/pki/ca.crt" \
    --kubelet-client-certificate "$D/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$D/pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$D/pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$D/pki/sa.pub" \
    --service-account-signing-key-file "$D/pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --profiling=false \
    --event-ttl 30m
  local i
  for ((i = 0; i < 240; i++)); do
    if kc get --raw /readyz >/dev/null 2>&1; then return 0; fi
    running kube-apiserver || break
    sleep 0.5
  done
  tail_log kube-apiserver
  die "kube-apiserver did not become ready on port $API_PORT"
}

start_controllers() {
  start kube-controller-manager "$(tool kube-controller-manager)" \
    --kubeconfig "$D/pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$D/pki/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$D/pki/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
    --service-account-private-key-file "$D/pki/sa.key" --root-ca-file "$D/pki/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file "$D/pki/ca.crt" --cluster-signing-key-file "$D/pki/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --leader-elect=false --profiling=false
  start kube-scheduler "$(tool kube-scheduler)" \
    --kubeconfig "$D/pki/scheduler.kubeconfig" \
    --authentication-kubeconfig "$D/pki/scheduler.kubeconfig" \
    --authorization-kubeconfig "$D/pki/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
    --leader-elect=false --profiling=false
}

write_kubelet_config() {
  local ip=$1
  mkdir -p "$D/kubelet" "$D/pod-logs"
  cat >"$D/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kind of host is cgroup v1 (hybrid) without systemd as PID 1.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$D/containerd/containerd.sock
address: $ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $D/pki/kubelet.crt
tlsPrivateKeyFile: $D/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $D/pki/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $D/pod-logs
resolvConf: /etc/resolv.conf
failSwapOn: false
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
shutdownGracePeriod: 0s
EOF
}

start_kubelet() {
  local ip=$1
  write_kubelet_config "$ip"
  start kubelet "$(tool kubelet)" \
    --config "$D/kubelet-config.yaml" \
    --kubeconfig "$D/pki/kubelet-client.kubeconfig" \
    --root-dir "$D/kubelet" --cert-dir "$D/kubelet/pki" \
    --hostname-override "$NODE" --node-ip "$ip" \
    --v 2
}

wait_node_ready() { # seconds
  local i
  for ((i = 0; i < $1 * 2; i++)); do
    if [ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
      return 0
    fi
    running kubelet || break
    sleep 0.5
  done
  return 1
}

write_helm_values() {
  local ip=$1
  # The chart's pods use the in-cluster config, i.e. the kubernetes Service.
  # There is no kube-proxy here, so point them at the API server directly.
  cat >"$D/helm-values.yaml" <<EOF
# Written by hack/local-cluster.sh for this cluster; pass after the chart's
# values: helm install ... -f hack/e2e/values.yaml -f $D/helm-values.yaml
image:
  repository: ${IMAGE%%:*}
  tag: "${IMAGE##*:}"
  pullPolicy: Never
hostSysPath: $D/fixtures/hgx-8gpu/sys
agent:
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "$ip"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
devicePlugin:
  podResourcesSocket: $D/kubelet/pod-resources/kubelet.sock
  stateDir: $D/pxn-state
  shmDir: $SHM_DIR
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "$ip"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
dra:
  cdiDir: $D/cdi
  kubeletPluginsDir: $D/kubelet/plugins
  kubeletRegistryDir: $D/kubelet/plugins_registry
  stateDir: $D/pxn-dra-state
  shmDir: $DRA_SHM_DIR
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "$ip"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
EOF
  cat >"$D/env" <<EOF
export PXN_CLUSTER_DIR=$D
export KUBECONFIG=$D/pki/admin.kubeconfig
export CONTAINERD_ADDRESS=$D/containerd/containerd.sock
export PXN_CLUSTER_NODE=$NODE
export PXN_CLUSTER_IMAGE=$IMAGE
export PXN_CLUSTER_HELM_VALUES=$D/helm-values.yaml
export PXN_CLUSTER_SHM_DIR=$SHM_DIR
export PXN_CLUSTER_DRA_SHM_DIR=$DRA_SHM_DIR
export PXN_CLUSTER_CDI_DIR=$D/cdi
export PXN_CLUSTER_CTR=$(tool ctr)
EOF
}

# --- up ----------------------------------------------------------------------------

healthy() {
  local c
  for c in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    running "$c" || return 1
  done
  [ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

up() {
  need_root
  if [ -f "$D/up" ]; then
    if healthy; then
      log "already up ($D); node $NODE Ready"
      return 0
    fi
    log "a previous cluster in $D is not healthy: tearing it down first"
    down
  elif [ -e "$D" ]; then
    log "$D exists from an unfinished run: tearing it down first"
    down
  fi
  local t0=$SECONDS ip
  ensure_packages
  ensure_tools
  ip=$(node_ip)
  check_free
  mkdir -p "$D"
  chmod 755 "$D"
  record_baseline
  echo "$NODE $ip" >"$D/node"
  log "state in $D, node $NODE ($ip)"

  make_pki "$ip"
  mkdir -p "$D/fixtures"
  cp -a "$repo/pkg/rail/testdata/sysfs/hgx-8gpu" "$D/fixtures/"
  chmod -R a+rX "$D/fixtures"
  write_helm_values "$ip"

  build_images pause-only
  local rc=0
  start_containerd || rc=$?
  if [ "$rc" -ne 0 ]; then
    local reason; reason=$(cat "$D/containerd-failure" 2>/dev/null || echo "containerd failed")
    down
    echo "CONTAINERD-FAILURE: $reason" >&2
    exit 3
  fi
  build_images
  import_images pause pxn
  log "containerd up, images imported ($((SECONDS - t0)) s)"

  start_etcd
  start_apiserver "$ip"
  log "kube-apiserver ready on https://$ip:$API_PORT ($((SECONDS - t0)) s)"
  start_controllers
  start_kubelet "$ip"
  if ! wait_node_ready 180; then
    tail_log kubelet 40
    die "node $NODE did not become Ready (logs in $D/logs)"
  fi
  touch "$D/up"
  log "up in $((SECONDS - t0)) s: node $NODE Ready"
  log "use: source <(hack/local-cluster.sh env)   or   hack/local-cluster.sh kubectl get nodes"
}

# --- down --------------------------------------------------------------------------

# drain: delete every workload and pod through the API so that the kubelet
# stops the sandboxes itself (CNI DEL, network namespaces, volume unmounts).
drain() {
  running kube-apiserver && running kubelet || return 0
  kc get --raw /readyz >/dev/null 2>&1 || return 0
  log "deleting workloads and pods"
  kc delete daemonsets,deployments,statefulsets,replicasets,jobs,cronjobs --all -A --wait=false >/dev/null 2>&1 || true
  kc delete pods --all -A --grace-period=2 --wait=false >/dev/null 2>&1 || true
  local i n
  for ((i = 0; i < 120; i++)); do
    n=$(ctr_ -n k8s.io tasks ls -q 2>/dev/null | wc -l) || n=0
    [ "$n" -eq 0 ] && return 0
    sleep 0.5
  done
  log "$n containers still running after 60 s; killing them"
}

# reap_containers: whatever the kubelet left, through containerd.
reap_containers() {
  running containerd || return 0
  local ns id
  for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      ctr_ -n "$ns" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      timeout 10 ctr_ -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
      ctr_ -n "$ns" containers rm "$id" >/dev/null 2>&1 || true
    done
  done
}

# Shims containerd started; their PID files are in its state folder.
kill_shims() {
  local f pid
  for f in "$D"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -q containerd-shim; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

unmount_under() { # PREFIX
  local pass m
  for pass in 1 2 3 4 5; do
    mapfile -t mounts < <(findmnt -rn -o TARGET | awk -v p="$1" 'index($0, p"/") == 1 || $0 == p' | sort -r)
    [ ${#mounts[@]} -eq 0 ] && return 0
    for m in "${mounts[@]}"; do
      m=$(printf '%b' "$m") # findmnt -r escapes blanks as \x20
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
  findmnt -rn -o TARGET | awk -v p="$1" 'index($0, p"/") == 1 || $0 == p' | grep -q . && return 1
  return 0
}

remove_cgroups() {
  local c p
  for c in "$CGROUP_ROOT"/*/; do
    for p in kubepods kubepods.slice; do
      [ -d "$c$p" ] || continue
      in_baseline cgroup "$c$p" && continue
      find "$c$p" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$c$p" ] && log "could not remove cgroup $c$p (processes left in it?)"
    done
  done
  return 0
}

# remove_iptables: the kubelet creates KUBE-FIREWALL (filter INPUT/OUTPUT),
# KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT; remove the KUBE-* chains that
# were not there before up, and the rules that jump to them.
remove_iptables() {
  local ipt t chain rule
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      for chain in $("$ipt" -w -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
        in_baseline chain "$ipt/$t/$chain" && continue
        while read -r rule; do
          [ -n "$rule" ] || continue
          eval "$ipt -w -t $t -D ${rule#-A }" 2>/dev/null || true
        done < <("$ipt" -w -t "$t" -S 2>/dev/null | grep -E -- "^-A .* -j $chain( |\$)" || true)
        "$ipt" -w -t "$t" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt" -w -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
        in_baseline chain "$ipt/$t/$chain" && continue
        "$ipt" -w -t "$t" -X "$chain" 2>/dev/null || log "could not delete $ipt -t $t chain $chain"
      done
    done
  done
  return 0
}

down() {
  need_root
  if [ ! -d "$D" ]; then
    log "nothing to do: $D does not exist"
    return 0
  fi
  local t0=$SECONDS n
  # Finish once started: an interrupted tear-down leaves half a cluster (a
  # second down would clean it up, but do not make the user need one).
  trap 'log "interrupt ignored while tearing down"' INT TERM
  [ -f "$D/baseline" ] || : >"$D/baseline"
  drain
  stop kubelet 20
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  reap_containers
  stop containerd 15
  kill_shims
  # Network namespaces the runtime created and nobody deleted.
  for n in /run/netns/cni-*; do
    [ -e "$n" ] || continue
    in_baseline netns "$(basename "$n")" && continue
    ip netns delete "$(basename "$n")" 2>/dev/null || { umount "$n" 2>/dev/null; rm -f "$n"; } || true
  done
  if ! unmount_under "$D"; then
    findmnt -rn -o TARGET | grep -F "$D" >&2 || true
    die "mounts remain under $D; not removing it"
  fi
  if [ -d /run/containerd ] && ! in_baseline path /run/containerd; then unmount_under /run/containerd || true; fi
  if ip link show "$BRIDGE" >/dev/null 2>&1 && ! in_baseline link "$BRIDGE"; then
    ip link delete "$BRIDGE" 2>/dev/null || log "could not delete $BRIDGE"
  fi
  remove_cgroups
  remove_iptables
  local p
  for p in "${HOST_PATHS[@]}" "$SHM_DIR" "$DRA_SHM_DIR"; do
    [ -e "$p" ] || continue
    in_baseline path "$p" && continue
    if findmnt -rn -o TARGET | awk -v p="$p" 'index($0, p"/") == 1 || $0 == p' | grep -q .; then
      log "mounts remain under $p; leaving it"
      continue
    fi
    rm -rf --one-file-system "$p"
  done
  rm -rf --one-file-system "$D"
  log "down in $((SECONDS - t0)) s: processes stopped, mounts, $BRIDGE, CNI and kubelet folders and $D removed"
}

# --- status ------------------------------------------------------------------------

status() {
  if [ ! -d "$D" ]; then
    echo "no cluster ($D does not exist)"
    return 1
  fi
  local c pid ok=0
  for c in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    if pid=$(pid_of "$c"); then
      printf '%-24s running (pid %s)\n' "$c" "$pid"
    else
      printf '%-24s NOT running\n' "$c"
      ok=1
    fi
  done
  if [ -f "$D/pki/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
    kc get nodes -o wide 2>&1 || true
    [ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] || ok=1
  else
    echo "kube-apiserver not answering"
    ok=1
  fi
  echo "state: $D   kubeconfig: $D/pki/admin.kubeconfig"
  return $ok
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  images)
    need_root
    [ -S "$D/containerd/containerd.sock" ] || die "no cluster in $D (run up first)"
    build_images
    import_images pause pxn
    ;;
  restart-kubelet)
    need_root
    [ -f "$D/up" ] || die "no cluster in $D (run up first)"
    ip=$(cut -d' ' -f2 "$D/node")
    stop kubelet 20
    echo "--- kubelet restarted by hack/local-cluster.sh restart-kubelet ---" >>"$D/logs/kubelet.log"
    start_kubelet "$ip"
    wait_node_ready 120 || { tail_log kubelet 40; die "node $NODE not Ready after the kubelet restart"; }
    log "kubelet restarted; node $NODE Ready"
    ;;
  env) cat "$D/env" 2>/dev/null || die "no cluster in $D (run up first)" ;;
  kubectl) shift; kc "$@" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
