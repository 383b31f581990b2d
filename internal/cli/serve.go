// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s listener: %w", what, err)
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
