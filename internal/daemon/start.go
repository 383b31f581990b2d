// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
)

// Main runs execute as the process: its context ends at SIGTERM or SIGINT,
// and what it returns is the exit status.
func Main(execute func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// RunE is the body of a daemon's command named name: validate's error is a
// usage error (exit 2); then one start line, and run until ctx ends, whose
// error is logged and exits 1. keysAndValues add to the start line.
func RunE(ctx context.Context, name string, validate func() error, run func(context.Context) error, keysAndValues ...any) func(*cobra.Command, []string) error {
	return func(*cobra.Command, []string) error {
		if err := validate(); err != nil {
			return err
		}
		defer klog.Flush()
		klog.InfoS("Starting "+name, append([]any{"version", version.String(), "revision", version.Revision(), "goVersion", runtime.Version()}, keysAndValues...)...)
		if err := run(ctx); err != nil {
			klog.ErrorS(err, name+" failed")
			return cli.ExitError{Code: 1}
		}
		return nil
	}
}

// Endpoints are the addresses of a daemon's metrics and health probes.
type Endpoints struct {
	Metrics, Health string
	// MetricsSecure serves /metrics over HTTPS to authenticated and
	// authorized callers only (SecureMetrics).
	MetricsSecure bool
}

// Bind adds --metrics-bind-address and --health-probe-bind-address, with
// the daemon's own defaults: each daemon of a node listens on ports of its
// own.
func (e *Endpoints) Bind(fs *pflag.FlagSet, metrics, health string) {
	fs.StringVar(&e.Metrics, "metrics-bind-address", metrics, `address of the Prometheus /metrics endpoint; "0" disables it`)
	fs.StringVar(&e.Health, "health-probe-bind-address", health, `address of /healthz (the process serves) and /readyz (the daemon is ready); "0" disables them`)
	fs.BoolVar(&e.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS (a self-signed certificate) only to callers whose bearer token the API server authenticates (TokenReview) and authorizes to get /metrics (SubjectAccessReview); needs API server access")
}

// Serve serves reg at /metrics and the probes, /readyz answering ready,
// on the addresses that are not off, until ctx ends; wg covers the servers.
// api is the API server that reviews metrics callers with MetricsSecure;
// without it MetricsSecure is an error.
func (e Endpoints) Serve(ctx context.Context, wg *sync.WaitGroup, reg *prometheus.Registry, ready func() bool, api *rest.Config) error {
	if Serves(e.Metrics) {
		var reviewer *rest.Config
		if e.MetricsSecure {
			if api == nil {
				return errors.New("--metrics-secure needs API server access (--kubeconfig, or running in a pod) to review callers")
			}
			reviewer = api
		}
		if err := ServeMetrics(ctx, wg, e.Metrics, reg, reviewer); err != nil {
			return err
		}
	}
	if Serves(e.Health) {
		if err := ServeHTTP(ctx, wg, "health probes", e.Health, Probes(ready)); err != nil {
			return err
		}
	}
	return nil
}
