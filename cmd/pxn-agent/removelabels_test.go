// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/pxn-project/pxn/internal/testtools"
)

// TestRemoveLabels runs `pxn-agent remove-labels` against a real API server:
// the pxn.io/* labels go, every other label stays, and a second run changes
// nothing.
func TestRemoveLabels(t *testing.T) {
	env := &envtest.Environment{BinaryAssetsDirectory: testtools.EnvtestAssets(t)}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	nodes := map[string]map[string]string{
		"gpu-a": {"pxn.io/capable": "true", "pxn.io/rails": "8", "kubernetes.io/os": "linux"},
		"gpu-b": {"pxn.io/capable": "false", "team": "infer"},
		"cpu-c": {"kubernetes.io/os": "linux"},
	}
	for name, labels := range nodes {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var stdout, stderr bytes.Buffer
	if code := execute(ctx, []string{"remove-labels", "--kubeconfig=" + kubeconfig}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, w := range []string{"node/gpu-a: removed pxn.io/capable, pxn.io/rails\n", "node/gpu-b: removed pxn.io/capable\n", "2 of 3 nodes had pxn.io/* labels\n"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, stdout.String())
		}
	}
	want := map[string]map[string]string{
		"gpu-a": {"kubernetes.io/os": "linux"},
		"gpu-b": {"team": "infer"},
		"cpu-c": {"kubernetes.io/os": "linux"},
	}
	for name, labels := range want {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(n.Labels, labels) {
			t.Errorf("node %s: labels %v, want %v", name, n.Labels, labels)
		}
	}

	stdout.Reset()
	if code := execute(ctx, []string{"remove-labels", "--kubeconfig=" + kubeconfig}, &stdout, &stderr); code != 0 || stdout.String() != "0 of 3 nodes had pxn.io/* labels\n" {
		t.Errorf("second run: exit %d, output %q", code, stdout.String())
	}
}
