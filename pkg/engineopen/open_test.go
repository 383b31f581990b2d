// SPDX-License-Identifier: Apache-2.0

package engineopen_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

type idleHop struct{}

func (idleHop) Submit([]relay.WriteOp) error   { return relay.ErrHopBusy }
func (idleHop) Poll([]relay.HopCompletion) int { return 0 }

type noTargets struct{}

func (noTargets) Resolve(string, uint64) (relay.Target, error) { return relay.Target{}, os.ErrNotExist }

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// open opens an engine from kv and returns it with what it logged.
func open(t *testing.T, kv map[string]string) (*relay.Engine, []string) {
	t.Helper()
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	e, err := engineopen.OpenFromEnv(context.Background(), env(kv), engineopen.HostDeps{
		Hop: idleHop{}, Directory: noTargets{}, Copier: cpucopy.NewHostCopier(cpucopy.HostCopierOptions{}),
		LocalHCA: "mlx5_0", Logger: log,
	})
	if err != nil {
		t.Fatalf("OpenFromEnv: %v", err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e, logged
}

func TestOpenFromEnvRefusal(t *testing.T) {
	root, err := os.MkdirTemp("/dev/shm", "pxn-refusal-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	bad := map[string]string{
		contract.EnvEnable: "1", contract.EnvGroupID: "job", contract.EnvRegistryRoot: root,
		contract.EnvRailMap: `{"mlx5_0":`, contract.EnvInflightDepth: "0",
	}
	e, logged := open(t, bad)
	if e.PXNActive() {
		t.Error("a refused configuration left PXN on")
	}
	if n := e.Counters().ConfigRefused; n != 2 {
		t.Errorf("the engine counts %d refused values; want 2", n)
	}
	var lines []string
	for _, l := range logged {
		if strings.Contains(l, "PXN configuration refused") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0]+lines[1], `"variable"="MC_PXN_RAIL_MAP"`) ||
		!strings.Contains(lines[0]+lines[1], `"variable"="MC_PXN_INFLIGHT_DEPTH"`) || !strings.Contains(lines[0], `"error"=`) {
		t.Errorf("logged %q; want one error line per refused variable, naming it", logged)
	}
	rs, nbad, err := registry.ReadRefusals(root)
	if err != nil || nbad != 0 || len(rs) != 1 || rs[0].Pid != os.Getpid() {
		t.Fatalf("ReadRefusals = %+v, %d bad, %v; want this process's record", rs, nbad, err)
	}
	var names []string
	for _, v := range rs[0].Variables {
		names = append(names, v.Name+"="+v.Value)
	}
	if got := strings.Join(names, " "); got != `MC_PXN_INFLIGHT_DEPTH=0 MC_PXN_RAIL_MAP={"mlx5_0":` {
		t.Errorf("record names %s", got)
	}

	// The same pid with an accepted configuration clears the record.
	good := map[string]string{contract.EnvEnable: "1", contract.EnvGroupID: "job", contract.EnvRegistryRoot: root}
	if e, _ := open(t, good); !e.PXNActive() || e.Counters().ConfigRefused != 0 {
		t.Fatalf("an accepted configuration: PXN on %v, %d refused values counted; want on and 0", e.PXNActive(), e.Counters().ConfigRefused)
	}
	if rs, _, _ := registry.ReadRefusals(root); len(rs) != 0 {
		t.Errorf("after an accepted configuration: %+v, want no record", rs)
	}
}

// Without a root of its own the refusal is only logged: the default root
// is the host's /dev/shm, which no agent reads.
func TestOpenFromEnvRefusalWithoutRoot(t *testing.T) {
	for name, kv := range map[string]map[string]string{
		"root unset":   {contract.EnvEnable: "1", contract.EnvRailMap: "junk"},
		"root refused": {contract.EnvEnable: "1", contract.EnvRailMap: "junk", contract.EnvRegistryRoot: "relative/dir"},
		"enable junk":  {contract.EnvEnable: "yes"},
	} {
		t.Run(name, func(t *testing.T) {
			e, logged := open(t, kv)
			if e.PXNActive() {
				t.Error("PXN on")
			}
			if !strings.Contains(strings.Join(logged, "\n"), "PXN configuration refused") {
				t.Errorf("logged %q", logged)
			}
			if rs, _, err := registry.ReadRefusals("/dev/shm"); err == nil {
				for _, r := range rs {
					if r.Pid == os.Getpid() {
						t.Errorf("a record in /dev/shm: %+v", r)
					}
				}
			}
		})
	}
}
