#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A Prometheus of the local cluster's own: Debian's prometheus package (the
# cluster group of hack/host-packages.sh) run as a plain process on this host,
# its configuration and storage in a folder of the caller's, scraping the
# targets it is given (pxn-agent at the pod address its metrics Service
# lists). The end-to-end suite (test/e2e) and make cluster-demo use it.
#
#   hack/e2e/prometheus.sh start DIR TARGET...  write DIR/prometheus.yml, start prometheus
#                                               (storage in DIR/data), wait until it is ready
#   hack/e2e/prometheus.sh stop DIR             stop it (safe to repeat)
#   hack/e2e/prometheus.sh query DIR EXPR       print the answer of an instant query (promtool)
#   hack/e2e/prometheus.sh url DIR              print its address
#
# Environment:
#   PXN_PROMETHEUS_PORT      listen port on 127.0.0.1 (default 19090)
#   PXN_PROMETHEUS_INTERVAL  scrape interval (default 2s)
#   PXN_PROMETHEUS_WAIT      seconds start waits for it to be ready (default 60)
#   PXN_PROMETHEUS_RULES     a rule file Prometheus loads and evaluates (default none)
set -euo pipefail

PORT=${PXN_PROMETHEUS_PORT:-19090}
INTERVAL=${PXN_PROMETHEUS_INTERVAL:-2s}
WAIT=${PXN_PROMETHEUS_WAIT:-60}
RULES=${PXN_PROMETHEUS_RULES:-}

die() { echo "prometheus.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

# pid_of DIR: the PID in DIR/prometheus.pid while that process still runs
# prometheus (a recycled PID is not ours).
pid_of() {
  local pid
  pid=$(cat "$1/prometheus.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -1 | grep -q 'prometheus$' || return 1
  echo "$pid"
}

start() {
  local dir=$1 t targets=""
  shift
  [ $# -gt 0 ] || die "start: no target"
  command -v prometheus >/dev/null || die "no prometheus binary (hack/host-packages.sh install cluster)"
  ! pid_of "$dir" >/dev/null || die "a prometheus of $dir runs already (pid $(pid_of "$dir"))"
  if ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .; then
    die "port $PORT is in use; set PXN_PROMETHEUS_PORT"
  fi
  mkdir -p "$dir/data"
  for t in "$@"; do targets+="\"$t\", "; done
  local rules=""
  if [ -n "$RULES" ]; then
    [ -r "$RULES" ] || die "no rule file $RULES"
    rules="rule_files: [\"$RULES\"]"
  fi
  # honor_labels keeps the namespace and pod the agent exports (the
  # workload's), as the chart's ServiceMonitor and PodMonitor do.
  cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: $INTERVAL
  scrape_timeout: $INTERVAL
  evaluation_interval: $INTERVAL
$rules
scrape_configs:
  - job_name: pxn-agent
    honor_labels: true
    static_configs:
      - targets: [${targets%, }]
EOF
  promtool check config "$dir/prometheus.yml" >/dev/null || die "promtool rejects $dir/prometheus.yml"
  setsid prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$PORT" </dev/null >>"$dir/prometheus.log" 2>&1 &
  echo $! >"$dir/prometheus.pid"
  echo "http://127.0.0.1:$PORT" >"$dir/url"
  local i
  for ((i = 0; i < WAIT * 2; i++)); do
    if curl -fsS -m 2 "http://127.0.0.1:$PORT/-/ready" >/dev/null 2>&1; then
      echo "prometheus.sh: ready at http://127.0.0.1:$PORT, scraping $* every $INTERVAL" >&2
      return 0
    fi
    pid_of "$dir" >/dev/null || { tail -n 20 "$dir/prometheus.log" >&2; die "prometheus exited"; }
    sleep 0.5
  done
  tail -n 20 "$dir/prometheus.log" >&2
  stop "$dir"
  die "not ready within ${WAIT}s"
}

stop() {
  local dir=$1 pid i
  pid=$(pid_of "$dir") || { rm -f "$dir/prometheus.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/prometheus.pid"
}

[ $# -ge 2 ] || usage
cmd=$1 dir=$2
shift 2
case $cmd in
  start) start "$dir" "$@" ;;
  stop) stop "$dir" ;;
  query)
    [ $# -eq 1 ] || usage
    promtool query instant "$(cat "$dir/url")" "$1"
    ;;
  url) cat "$dir/url" ;;
  *) usage ;;
esac
