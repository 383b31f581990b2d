// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/relay"
)

// TestRoCESubnetNodeGetsPXN follows a RoCE node whose plugin names rails by
// subnet from discovery to an engine: the plugin binary discovers the
// fixture, answers the stub kubelet's Allocate over gRPC, links the
// container's group folder, and the environment it hands the container
// opens an engine with PXN active on the HCA's subnet rail.
func TestRoCESubnetNodeGetsPXN(t *testing.T) {
	root := t.TempDir()
	src := filepath.Join("..", "..", "pkg", "rail", "testdata", "sysfs", "pcie-8gpu-4nic")
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatalf("copy fixture %s: %v", src, err)
	}
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{nodeRoot: root, extra: []string{"--rail-strategy=subnet"}})
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	stream, err := c.ListAndWatch(contextFor(t, 30*time.Second), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recvHealth(t, stream, pluginapi.Healthy)

	got := allocate(t, c, "pxn-relay-05")
	wantRails := map[string]string{"mlx5_0": "10.1.0.0/24", "mlx5_1": "10.1.1.0/24", "mlx5_2": "10.1.2.0/24", "mlx5_3": "10.1.3.0/24"}
	cfg, errs := engineconfig.FromEnv(lookup(got.Envs))
	if len(errs) > 0 || !cfg.Enable {
		t.Fatalf("the engine refuses the plugin's environment %v: enabled %v, %v", got.Envs, cfg.Enable, errs)
	}
	if !maps.Equal(cfg.RailMap, wantRails) {
		t.Fatalf("the engine reads rail map %v from %s=%s, want %v", cfg.RailMap, contract.EnvRailMap, got.Envs[contract.EnvRailMap], wantRails)
	}

	k.setPods(podRes("serving", "prefill-0", resource, map[string][]string{"main": {"pxn-relay-05"}}))
	preStart(t, c, "pxn-relay-05")
	group := p.group(p.key(t, "serving", group.SourcePodName, "prefill-0"))
	if target := readLink(t, got.Mounts[0].HostPath); target != group {
		t.Fatalf("mount source %s → %s, want the group folder %s", got.Mounts[0].HostPath, target, group)
	}
	// The container sees the group folder at the mount's container path,
	// which is the registry root the plugin hands it.
	env := maps.Clone(got.Envs)
	if env[contract.EnvRegistryRoot] != got.Mounts[0].ContainerPath {
		t.Fatalf("%s=%s, but the group folder is mounted at %s", contract.EnvRegistryRoot, env[contract.EnvRegistryRoot], got.Mounts[0].ContainerPath)
	}
	env[contract.EnvRegistryRoot] = group

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := engineopen.OpenFromEnv(ctx, lookup(env), engineopen.HostDeps{Hop: idleHop{}, Directory: noTargets{}, Copier: cpucopy.NewHostCopier(), LocalHCA: "mlx5_2", Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if !e.PXNActive() || e.LocalRail() != "10.1.2.0/24" {
		t.Fatalf("engine: PXN active %v on rail %q, want active on 10.1.2.0/24", e.PXNActive(), e.LocalRail())
	}
}

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

// idleHop and noTargets stand for a host transport that carries nothing:
// the test only opens the engine, with the host copier libpxn ships.
type idleHop struct{}

func (idleHop) Submit([]relay.WriteOp) error   { return relay.ErrHopBusy }
func (idleHop) Poll([]relay.HopCompletion) int { return 0 }

type noTargets struct{}

func (noTargets) Resolve(session string, _ uint64) (relay.Target, error) {
	return relay.Target{}, os.ErrNotExist
}
