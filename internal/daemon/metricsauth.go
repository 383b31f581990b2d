// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
)

// SecureMetrics wraps h so that it answers only callers whose bearer token
// the API server at cfg authenticates (a TokenReview) and authorizes for the
// request's verb and path (a SubjectAccessReview), as controller-runtime's
// metrics filters do for kubebuilder projects, and returns the TLS
// configuration to serve it with, a self-signed certificate as
// kube-controller-manager's metrics have by default, so a token never
// travels in the clear. log receives a line per failed review.
func SecureMetrics(cfg *rest.Config, h http.Handler, log klog.Logger) (http.Handler, *tls.Config, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: API client: %w", err)
	}
	filter, err := filters.WithAuthenticationAndAuthorization(cfg, client)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: %w", err)
	}
	secured, err := filter(log, h)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: %w", err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{{127, 0, 0, 1}}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: self-signed certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: self-signed certificate: %w", err)
	}
	return secured, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
