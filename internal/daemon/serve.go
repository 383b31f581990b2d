// SPDX-License-Identifier: Apache-2.0

// Package daemon holds what PXN's node daemons share beside their command
// line: the process's start and end, health probes, HTTP endpoints and
// their flags, a process metrics registry and the API server configuration. Apart from internal/cli so that the tools that use
// only the command line (pxn-bench, pxn-gpucheck) link no Kubernetes client
// and no Prometheus.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/buildinfo"
	"github.com/pxn-project/pxn/internal/version"
)

// Serves says whether a bind address flag asks for an endpoint: "0" (and,
// as before it was "0", an empty value) disables it.
func Serves(addr string) bool { return addr != "0" && addr != "" }

// ProcessRegistry is a metrics registry holding the Go runtime's, the
// process's and the build's collectors, for a daemon to add its own to.
func ProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	return reg
}

// ServeMetrics serves reg at /metrics on addr until ctx ends (ServeHTTP):
// over plain HTTP to anyone when api is nil, else over HTTPS to callers the
// API server at api authenticates and authorizes (SecureMetrics).
func ServeMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, reg *prometheus.Registry, api *rest.Config) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if api == nil {
		return ServeHTTP(ctx, wg, "metrics", addr, mux)
	}
	h, tlsConfig, err := SecureMetrics(api, mux, klog.Background().WithName("metrics"))
	if err != nil {
		return err
	}
	return serve(ctx, wg, "metrics (authenticated, HTTPS)", addr, h, tlsConfig)
}

// ErrNoAPIServer is why RESTConfig has no configuration: no kubeconfig was
// given and the process does not run in a pod.
var ErrNoAPIServer = errors.New("no --kubeconfig and not in a pod")

// RESTConfig is the API server configuration of the command named
// component: from kubeconfig when given, else in-cluster (an error wrapping
// ErrNoAPIServer when not in a pod). Requests carry the component and the
// version as their user agent.
func RESTConfig(kubeconfig, component string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoAPIServer, err)
	}
	cfg.UserAgent = component + "/" + version.String()
	return cfg, nil
}

// Probes answers /healthz while the process serves and /readyz while
// registered says the kubelet holds the plugin's registration.
func Probes(registered func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !registered() {
			http.Error(w, "not registered with the kubelet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// ServeHTTP serves h on addr until ctx ends; wg covers the server's
// goroutines. what names the endpoint in errors and log lines.
func ServeHTTP(ctx context.Context, wg *sync.WaitGroup, what, addr string, h http.Handler) error {
	return serve(ctx, wg, what, addr, h, nil)
}

// serve is ServeHTTP, over TLS when tlsConfig is not nil.
func serve(ctx context.Context, wg *sync.WaitGroup, what, addr string, h http.Handler, tlsConfig *tls.Config) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s listener: %w", what, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "HTTP server ended", "what", what, "addr", addr)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	klog.InfoS("Serving "+what, "addr", ln.Addr().String())
	return nil
}
