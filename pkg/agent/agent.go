// SPDX-License-Identifier: Apache-2.0

// Package agent publishes a node's rail layout as its PxnRailMap, keeps the
// map's conditions current and labels the node. It runs as a
// controller-runtime manager: one controller with a single key (the node),
// fed by the informer caches of PxnRailMaps and the node and by a
// nodestate.Monitor that rediscovers on every resync and whenever the host's
// HCA/GPU fingerprint changes.
package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/nodestate"
)

// FieldManager is the server-side apply field manager of every write the agent
// makes.
const FieldManager = "pxn-agent"

// Discovery is the result of one rail discovery on the host.
type Discovery struct {
	Layout pxnv1alpha1.RailLayout
	// Ready is true when every port of every HCA on a rail is ACTIVE;
	// NotReadyMessage says which ones are not.
	Ready           bool
	NotReadyMessage string
	// SharedSubnetMessage, when set, says which HCAs the subnet strategy
	// left without a rail because they share one subnet prefix.
	SharedSubnetMessage string
	Warnings            []string
}

// Options configure an agent.
type Options struct {
	NodeName string
	// Discoverer finds the node's rail layout. When it is a
	// nodestate.Fingerprinter, a change of its fingerprint triggers a
	// discovery; Fingerprint must then be cheap.
	Discoverer nodestate.Discoverer
	// Resync is the period of unconditional rediscovery and reconciliation.
	Resync time.Duration
	// PollInterval is the period of the fingerprint poll.
	PollInterval time.Duration
	// AgentVersion is written to status.agentVersion.
	AgentVersion string
	// MetricsBindAddress serves /metrics; "0" disables it.
	MetricsBindAddress string
	// MetricsSecure serves /metrics over HTTPS to callers the API server
	// authenticates and authorizes only (controller-runtime's metrics
	// filters).
	MetricsSecure bool
	// HealthProbeBindAddress serves /healthz and /readyz; "0" disables it.
	HealthProbeBindAddress string
	// Registerer receives the agent's metrics; nil means controller-runtime's
	// registry, which the metrics endpoint serves.
	Registerer prometheus.Registerer
	// Events receives the Events on the node and its PxnRailMap; nil means
	// a recorder writing events.k8s.io/v1 Events through cfg, as
	// ReportingController, for as long as Run runs.
	Events events.EventRecorder
	// MinBackoff and MaxBackoff bound the exponential backoff after a failed
	// reconciliation.
	MinBackoff, MaxBackoff time.Duration
	// Ranks, when set, adds the pxn_* metrics of the node's ranks
	// (RankCollector) to the metrics endpoint.
	Ranks *RankMetricsOptions
	// Logger receives the agent's lines and controller-runtime's; the zero
	// Logger discards them.
	Logger klog.Logger
}

func (o *Options) defaults() error {
	if o.NodeName == "" {
		return errors.New("node name is empty (set --node-name or NODE_NAME)")
	}
	if o.Discoverer == nil {
		return errors.New("no discoverer")
	}
	if o.Resync <= 0 {
		o.Resync = 60 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 2 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.MetricsBindAddress == "" {
		o.MetricsBindAddress = "0"
	}
	if o.HealthProbeBindAddress == "" {
		o.HealthProbeBindAddress = "0"
	}
	if o.Registerer == nil {
		o.Registerer = ctrlmetrics.Registry
	}
	return nil
}

// newEventRecorder returns a recorder that writes Events through cfg until
// stop is called.
func newEventRecorder(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) (events.EventRecorder, func(), error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("events client: %w", err)
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("start event recording: %w", err)
	}
	return b.NewRecorder(scheme, ReportingController), b.Shutdown, nil
}

// Run runs the agent until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	if err := opts.defaults(); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := pxnv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	m, err := newMetrics(opts.Registerer, opts.NodeName)
	if err != nil {
		return err
	}
	logger := opts.Logger.WithValues("node", opts.NodeName)
	if opts.Ranks != nil {
		ro := *opts.Ranks
		if ro.Logger.GetSink() == nil {
			ro.Logger = logger.WithName("ranks")
		}
		rc, err := NewRankCollector(ro)
		if err != nil {
			return err
		}
		if err := opts.Registerer.Register(rc); err != nil {
			return fmt.Errorf("register rank metrics: %w", err)
		}
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		Logger:                 logger,
		Metrics:                metricsOptions(opts),
		HealthProbeBindAddress: opts.HealthProbeBindAddress,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}: {Field: fields.OneTermEqualSelector("metadata.name", opts.NodeName)},
		}},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}

	if opts.Events == nil {
		rec, stop, err := newEventRecorder(ctx, cfg, scheme)
		if err != nil {
			return err
		}
		defer stop()
		opts.Events = rec
	}

	rails := newRailWatch(opts, m, logger)
	r := &reconciler{
		node:         opts.NodeName,
		agentVersion: opts.AgentVersion,
		reader:       mgr.GetCache(),
		writer:       mgr.GetClient(),
		state:        rails,
		metrics:      m,
		events:       opts.Events,
		log:          logger,
	}
	c, err := controller.New("pxn-agent", mgr, controller.Options{
		Reconciler:              r,
		MaxConcurrentReconciles: 1,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](opts.MinBackoff, opts.MaxBackoff),
		SkipNameValidation:      ptr.To(true),
		Logger:                  logger,
	})
	if err != nil {
		return fmt.Errorf("create controller: %w", err)
	}
	if err := watch(c, mgr.GetCache(), opts.NodeName, rails.events); err != nil {
		return err
	}
	if err := mgr.Add(rails); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("published", r.published); err != nil {
		return err
	}
	logger.Info("Watching the node and its PxnRailMap", "resync", opts.Resync)
	return mgr.Start(ctx)
}

// metricsOptions serves /metrics plainly, or, with MetricsSecure, over HTTPS
// (a self-signed certificate) behind a TokenReview and a
// SubjectAccessReview of every caller.
func metricsOptions(opts Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsBindAddress}
	if opts.MetricsSecure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return o
}
