// SPDX-License-Identifier: Apache-2.0

package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/pxn-project/pxn/internal/daemon"
	"github.com/pxn-project/pxn/internal/testtools"
)

// TestSecureMetrics runs the secured handler against a real API server: no
// token is 401, a token of an account without the reader role is 403, and
// one bound to get /metrics reads the metrics, over TLS only.
func TestSecureMetrics(t *testing.T) {
	env := &envtest.Environment{BinaryAssetsDirectory: testtools.EnvtestAssets(t)}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start the API server: %v", err)
	}
	t.Cleanup(func() { env.Stop() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(cfg)

	const ns = "default"
	token := func(name string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("scraper"), token("stranger")
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "scraper"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "pxn_ranks 3") })
	h, tlsConfig, err := daemon.SecureMetrics(cfg, metrics, klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = tlsConfig
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()

	get := func(token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		// controller-runtime's filter answers 500 to a token the API server
		// cannot parse: refused, whatever the code.
		{"a forged token", "not-a-token", 0},
		{"an account without the reader role", stranger, http.StatusForbidden},
		{"the reader", reader, http.StatusOK},
	} {
		code, body := get(tc.token)
		if tc.want == 0 && code >= http.StatusBadRequest {
			continue
		}
		if code != tc.want {
			t.Errorf("%s: HTTP %d (%s), want %d", tc.who, code, strings.TrimSpace(body), tc.want)
		}
		if (code == http.StatusOK) != strings.Contains(body, "pxn_ranks 3") {
			t.Errorf("%s: HTTP %d with body %q", tc.who, code, body)
		}
	}

	plain, err := http.Get(strings.Replace(srv.URL, "https://", "http://", 1) + "/metrics")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Error("the metrics answer plain HTTP")
		}
	}
}

// TestMetricsSecureNeedsAPIServer: --metrics-secure without an API server to
// review callers is refused, never served open.
func TestMetricsSecureNeedsAPIServer(t *testing.T) {
	e := daemon.Endpoints{Metrics: "127.0.0.1:0", Health: "0", MetricsSecure: true}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); wg.Wait() }()
	err := e.Serve(ctx, &wg, prometheus.NewRegistry(), func() bool { return true }, nil)
	if err == nil || !strings.Contains(err.Error(), "--metrics-secure needs API server access") {
		t.Fatalf("Serve = %v, want a refusal naming --metrics-secure", err)
	}
}
