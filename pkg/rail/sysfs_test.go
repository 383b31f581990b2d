// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

// copyFixture copies a committed fixture tree into a temporary folder,
// symlinks as symlinks.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	src, dst := fixture(name), t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, out)
		case d.IsDir():
			return os.MkdirAll(out, 0o755)
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(out, b, 0o644)
		}
	})
	if err != nil {
		t.Fatalf("copy fixture %s: %v", name, err)
	}
	return dst
}

// Physical folders of the 8-GPU fixture.
const (
	hgxMLX51 = "sys/devices/pci0000:26/0000:26:01.0/0000:27:00.0/infiniband/mlx5_1"
	hgxMLX53 = "sys/devices/pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:01.0/0000:4c:00.0/infiniband/mlx5_3"
	hgxMLX50 = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0/infiniband/mlx5_0"
	hgxGPU0  = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
)

// oddBase is a small two-socket machine whose copies the odd-sysfs tests
// break: three GPU/NIC pairs, each behind its own switch on its own root
// complex (two on NUMA node 0, one on node 1), and a RoCE storage NIC on a
// root port of its own per socket. Under pci-order mlx5_0, mlx5_2 and
// mlx5_3 are rail0..rail2.
func oddBase() sysfixture.Machine {
	B, bdf := sysfixture.Bridge, sysfixture.BDF
	pair := func(bus, numa int, nic string, rail int) sysfixture.Root {
		return sysfixture.Root{Bus: bus, NUMA: numa, Devices: []sysfixture.Device{
			B(bdf(bus, 1, 0), B(bdf(bus+1, 0, 0),
				B(bdf(bus+2, 0, 0), sysfixture.GPU(bdf(bus+3, 0, 0))),
				B(bdf(bus+2, 1, 0), sysfixture.IBNIC(bdf(bus+4, 0, 0), nic, rail)),
			)),
		}}
	}
	storage := func(bus, numa int, nic, ip string) sysfixture.Root {
		return sysfixture.Root{Bus: bus, NUMA: numa, Devices: []sysfixture.Device{
			B(bdf(bus, 1, 0), sysfixture.RoCENIC(bdf(bus+1, 0, 0), nic, ip)),
		}}
	}
	return sysfixture.Machine{Roots: []sysfixture.Root{
		pair(0x15, 0, "mlx5_0", 0),
		storage(0x26, 0, "mlx5_1", "10.200.0.11"),
		pair(0x37, 0, "mlx5_2", 1),
		pair(0x97, 1, "mlx5_3", 2),
		storage(0xa8, 1, "mlx5_4", "10.200.1.11"),
	}}
}

// Physical folders of oddBase.
const (
	mlx50Dir = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0/infiniband/mlx5_0"
	mlx51Dir = "sys/devices/pci0000:26/0000:26:01.0/0000:27:00.0/infiniband/mlx5_1"
	mlx52Dir = "sys/devices/pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:01.0/0000:3b:00.0/infiniband/mlx5_2"
	mlx53Dir = "sys/devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:01.0/0000:9b:00.0/infiniband/mlx5_3"
	gpu0Dir  = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
	gpu1Dir  = "sys/devices/pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:00.0/0000:3a:00.0"
)

func writeAt(t *testing.T, root, rel, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, rel), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func linkAt(t *testing.T, root, rel, target string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func removeAt(t *testing.T, root, rel string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(root, rel)); err != nil {
		t.Fatal(err)
	}
}

func hcaNamed(l *Layout, name string) *HCA {
	for i := range l.HCAs {
		if l.HCAs[i].Name == name {
			return &l.HCAs[i]
		}
	}
	return nil
}

// TestOddSysfs breaks copies of a small machine one way each. Discovery must
// go on, skip or mark the entry, and warn naming the path.
func TestOddSysfs(t *testing.T) {
	type warning struct{ path, problem string }
	tests := []struct {
		name     string
		strategy string
		breakIt  func(t *testing.T, root string)
		warnings []warning
		check    func(t *testing.T, l *Layout)
	}{
		{
			name:    "clean",
			breakIt: func(*testing.T, string) {},
			check: func(t *testing.T, l *Layout) {
				if got := l.RailMapJSON(); got != `{"mlx5_0":"rail0","mlx5_2":"rail1","mlx5_3":"rail2"}` || len(l.HCAs) != 5 || len(l.GPUs) != 3 {
					t.Errorf("rail map %s, %d HCAs, %d GPUs", got, len(l.HCAs), len(l.GPUs))
				}
			},
		},
		{
			name:     "truncated state",
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, mlx52Dir+"/ports/1/state", "4:") },
			warnings: []warning{{mlx52Dir + "/ports/1/state", `"4:" is not "N: STATE"`}},
			check: func(t *testing.T, l *Layout) {
				h := hcaNamed(l, "mlx5_2")
				if h.State != StateUnknown || h.Rail != "rail1" {
					t.Errorf("mlx5_2 %+v, want state UNKNOWN, still on rail1", h)
				}
				if ok, msg := l.Ready(); ok || msg != "not active: mlx5_2 port 1 UNKNOWN (LinkUp)" {
					t.Errorf("Ready() = %v, %q", ok, msg)
				}
				if !l.Healthy() {
					t.Error("not healthy with two ACTIVE rails")
				}
			},
		},
		{
			name:     "missing state",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, mlx52Dir+"/ports/1/state") },
			warnings: []warning{{mlx52Dir + "/ports/1/state", "missing"}},
			check: func(t *testing.T, l *Layout) {
				if h := hcaNamed(l, "mlx5_2"); h.State != StateUnknown || h.PhysState != "LinkUp" {
					t.Errorf("mlx5_2 %+v", h)
				}
			},
		},
		{
			name: "state is a folder",
			breakIt: func(t *testing.T, root string) {
				removeAt(t, root, mlx52Dir+"/ports/1/state")
				if err := os.Mkdir(filepath.Join(root, mlx52Dir, "ports/1/state"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			warnings: []warning{{mlx52Dir + "/ports/1/state", "unreadable: is a directory"}},
		},
		{
			name:     "garbage phys_state, rate and link_layer",
			strategy: StrategySubnet,
			breakIt: func(t *testing.T, root string) {
				writeAt(t, root, mlx50Dir+"/ports/1/phys_state", "LinkUp\n")
				writeAt(t, root, mlx50Dir+"/ports/1/rate", "fast\n")
				writeAt(t, root, mlx50Dir+"/ports/1/link_layer", "Token Ring\n")
			},
			warnings: []warning{
				{mlx50Dir + "/ports/1/phys_state", `"LinkUp" is not "N: STATE"`},
				{mlx50Dir + "/ports/1/link_layer", `"Token Ring" is neither InfiniBand nor Ethernet`},
				{mlx50Dir + "/ports/1/rate", `"fast" is not`},
				{mlx50Dir + "/ports/1/gids", `mlx5_0 has no rail: link layer "" has no subnet`},
			},
			check: func(t *testing.T, l *Layout) {
				h := hcaNamed(l, "mlx5_0")
				if h.State != StateActive || h.PhysState != "" || h.Rate != "" || h.LinkLayer != "" || h.Rail != "" {
					t.Errorf("mlx5_0 %+v", h)
				}
			},
		},
		{
			name:     "garbage GID",
			strategy: StrategySubnet,
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, mlx50Dir+"/ports/1/gids/0", "fe80::1\n") },
			warnings: []warning{
				{mlx50Dir + "/ports/1/gids/0", `"fe80::1" is not a GID`},
				{mlx50Dir + "/ports/1/gids", "mlx5_0 has no rail: empty GID table"},
			},
			check: func(t *testing.T, l *Layout) {
				want := map[string]string{"mlx5_2": "fe80:0000:0000:0001", "mlx5_3": "fe80:0000:0000:0002"}
				if !reflect.DeepEqual(l.RailMap, want) || l.Rails != 2 {
					t.Errorf("rail map %v, want %v", l.RailMap, want)
				}
			},
		},
		{
			name:     "RoCE port without an IPv4 GID",
			strategy: StrategySubnet,
			breakIt: func(t *testing.T, root string) {
				// Without mlx5_0, GPU 0's nearest is storage NIC mlx5_1
				// (NODE, fewest bridges), which then lacks an IPv4 GID.
				removeAt(t, root, "sys/class/infiniband/mlx5_0")
				for _, g := range []string{"2", "3"} {
					writeAt(t, root, mlx51Dir+"/ports/1/gids/"+g, sysfixture.ZeroGID+"\n")
				}
			},
			warnings: []warning{{mlx51Dir + "/ports/1/gids", "mlx5_1 has no rail: no IPv4-mapped GID"}},
			check: func(t *testing.T, l *Layout) {
				if g := l.GPUs[0]; g.HCA != "mlx5_1" || g.Distance != DistanceNODE || g.Rail != "" {
					t.Errorf("GPU 0 %+v, want nearest mlx5_1 (NODE) without rail", g)
				}
			},
		},
		{
			name:     "missing GID table",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, mlx51Dir+"/ports/1/gids") },
			warnings: []warning{{mlx51Dir + "/ports/1/gids", "unreadable GID table"}},
		},
		{
			name:     "garbage NUMA node of a GPU",
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, gpu0Dir+"/numa_node", "zero\n") },
			warnings: []warning{{gpu0Dir + "/numa_node", `"zero" is not a NUMA node`}},
			check: func(t *testing.T, l *Layout) {
				if g := l.GPUs[0]; g.NUMANode != -1 || g.HCA != "mlx5_0" || g.Distance != DistancePIX {
					t.Errorf("GPU 0 %+v", g)
				}
				for _, p := range l.Pairs {
					if p.GPU == 0 && p.Distance == DistanceSYS {
						t.Errorf("GPU 0 of unknown NUMA node is SYS to %s", p.HCA)
					}
				}
			},
		},
		{
			name: "huge NUMA node of an HCA",
			breakIt: func(t *testing.T, root string) {
				writeAt(t, root, mlx52Dir+"/../../numa_node", "99999999999999999999\n")
			},
			warnings: []warning{{"sys/devices/pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:01.0/0000:3b:00.0/numa_node", "is not a NUMA node"}},
			check: func(t *testing.T, l *Layout) {
				if h := hcaNamed(l, "mlx5_2"); h.NUMANode != -1 || h.Rail != "rail1" {
					t.Errorf("mlx5_2 %+v", h)
				}
			},
		},
		{
			name:     "empty NUMA node",
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, gpu1Dir+"/numa_node", "") },
			warnings: []warning{{gpu1Dir + "/numa_node", "empty"}},
		},
		{
			name: "dangling class link",
			breakIt: func(t *testing.T, root string) {
				linkAt(t, root, "sys/class/infiniband/mlx5_3", "../../devices/pci0000:97/gone/infiniband/mlx5_3")
			},
			warnings: []warning{{"sys/class/infiniband/mlx5_3", "skipped: ROOT/sys/devices/pci0000:97/gone: "}},
			check: func(t *testing.T, l *Layout) {
				// GPU 2 loses its NIC; of the NODE-distance NICs the storage
				// NIC on its own root port has the fewest bridges.
				if g := l.GPUs[2]; len(l.HCAs) != 4 || g.HCA != "mlx5_4" || g.Distance != DistanceNODE || g.Rail != "rail2" {
					t.Errorf("%d HCAs, GPU 2 %+v", len(l.HCAs), g)
				}
			},
		},
		{
			name:     "symlink loop",
			breakIt:  func(t *testing.T, root string) { linkAt(t, root, "sys/class/infiniband/mlx5_3", "mlx5_3") },
			warnings: []warning{{"sys/class/infiniband/mlx5_3", "too many levels of symbolic links"}},
		},
		{
			name:     "missing device link",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, mlx52Dir+"/device") },
			warnings: []warning{{mlx52Dir + "/device", "skipped mlx5_2"}},
			check: func(t *testing.T, l *Layout) {
				if hcaNamed(l, "mlx5_2") != nil || l.GPUs[1].HCA == "mlx5_2" {
					t.Errorf("mlx5_2 kept")
				}
			},
		},
		{
			name: "device link to a virtual device, absolute",
			breakIt: func(t *testing.T, root string) {
				if err := os.MkdirAll(filepath.Join(root, "sys/devices/virtual/net/lo"), 0o755); err != nil {
					t.Fatal(err)
				}
				linkAt(t, root, mlx52Dir+"/device", "/sys/devices/virtual/net/lo")
			},
			warnings: []warning{{mlx52Dir + "/device", "skipped mlx5_2: /sys/devices/virtual/net/lo is not below a PCI host bridge"}},
		},
		{
			name:    "absolute class link stays under the host root",
			breakIt: func(t *testing.T, root string) { linkAt(t, root, "sys/class/infiniband/mlx5_0", "/"+mlx50Dir) },
			check: func(t *testing.T, l *Layout) {
				if hcaNamed(l, "mlx5_0") == nil || l.RailMap["mlx5_0"] != "rail0" {
					t.Errorf("mlx5_0 lost: %v", l.RailMap)
				}
			},
		},
		{
			name: "link climbing above the host root stops there",
			breakIt: func(t *testing.T, root string) {
				linkAt(t, root, "sys/class/infiniband/mlx5_0", strings.Repeat("../", 12)+mlx50Dir)
			},
			check: func(t *testing.T, l *Layout) {
				if hcaNamed(l, "mlx5_0") == nil {
					t.Error("mlx5_0 lost")
				}
			},
		},
		{
			name: "odd port and GID names",
			breakIt: func(t *testing.T, root string) {
				if err := os.MkdirAll(filepath.Join(root, mlx53Dir, "ports/foo"), 0o755); err != nil {
					t.Fatal(err)
				}
				writeAt(t, root, mlx53Dir+"/ports/1/gids/x", "")
			},
			warnings: []warning{
				{mlx53Dir + "/ports/foo", "not a port number"},
				{mlx53Dir + "/ports/1/gids/x", "not a GID index"},
			},
		},
		{
			name:     "no ports at all",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, mlx53Dir+"/ports") },
			warnings: []warning{{mlx53Dir + "/ports", "missing: the device shows no port"}},
			check: func(t *testing.T, l *Layout) {
				h := hcaNamed(l, "mlx5_3")
				if h.Port != 0 || h.State != StateUnknown || h.Rail != "rail2" {
					t.Errorf("mlx5_3 %+v, want no port, UNKNOWN, still on rail2", h)
				}
				if ok, msg := l.Ready(); ok || msg != "not active: mlx5_3 has no port" {
					t.Errorf("Ready() = %v, %q", ok, msg)
				}
			},
		},
		{
			name:     "garbage GPU vendor",
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, gpu1Dir+"/vendor", "nvidia\n") },
			warnings: []warning{{gpu1Dir + "/vendor", `"nvidia" is not a hex number`}},
			check: func(t *testing.T, l *Layout) {
				if got := l.RailMapJSON(); len(l.GPUs) != 2 || got != `{"mlx5_0":"rail0","mlx5_3":"rail1"}` {
					t.Errorf("%d GPUs, rail map %s; want 2 GPUs, mlx5_2 unrailed", len(l.GPUs), got)
				}
			},
		},
		{
			name:     "empty GPU class",
			breakIt:  func(t *testing.T, root string) { writeAt(t, root, gpu1Dir+"/class", "\n") },
			warnings: []warning{{gpu1Dir + "/class", "empty"}},
		},
		{
			name: "odd PCI bus entries",
			breakIt: func(t *testing.T, root string) {
				linkAt(t, root, "sys/bus/pci/devices/garbage", "../../../devices/pci0000:15")
				linkAt(t, root, "sys/bus/pci/devices/0000:9a:00.0", "../../../devices/pci0000:97/gone")
			},
			warnings: []warning{
				{"sys/bus/pci/devices/0000:9a:00.0", "skipped: "},
				{"sys/bus/pci/devices/garbage", "not a PCI address"},
			},
			check: func(t *testing.T, l *Layout) {
				if len(l.GPUs) != 2 {
					t.Errorf("%d GPUs, want 2", len(l.GPUs))
				}
			},
		},
		{
			name:     "no RDMA class",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, "sys/class/infiniband") },
			warnings: []warning{{"sys/class/infiniband", "missing: no RDMA devices"}},
			check: func(t *testing.T, l *Layout) {
				if len(l.HCAs) != 0 || l.Rails != 0 || len(l.GPUs) != 3 || l.GPUs[0].HCA != "" || l.Healthy() {
					t.Errorf("layout %+v", l)
				}
			},
		},
		{
			name:     "no PCI bus",
			breakIt:  func(t *testing.T, root string) { removeAt(t, root, "sys/bus") },
			warnings: []warning{{"sys/bus/pci/devices", "unreadable, so no GPUs"}},
			check: func(t *testing.T, l *Layout) {
				if len(l.GPUs) != 0 || len(l.HCAs) != 5 || l.Rails != 0 {
					t.Errorf("%d GPUs, %d HCAs, %d rails", len(l.GPUs), len(l.HCAs), l.Rails)
				}
			},
		},
	}
	base := oddBase().Render()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			if err := base.Write(root); err != nil {
				t.Fatal(err)
			}
			tc.breakIt(t, root)
			var logged []string
			logger := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
			l, err := Discover(context.Background(), Options{NodeRoot: root, Strategy: tc.strategy, Logger: logger})
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if len(l.Warnings) != len(tc.warnings) {
				t.Errorf("warnings:\n %s\nwant %d", strings.Join(l.Warnings, "\n "), len(tc.warnings))
			}
			for _, w := range tc.warnings {
				prefix := filepath.Join(root, w.path) + ": "
				problem := strings.ReplaceAll(w.problem, "ROOT/", root+"/")
				found := false
				for _, got := range l.Warnings {
					if strings.HasPrefix(got, prefix) && strings.Contains(got[len(prefix):], problem) {
						found = true
					}
				}
				if !found {
					t.Errorf("no warning %q...%q among:\n %s", prefix, problem, strings.Join(l.Warnings, "\n "))
				}
			}
			if len(logged) != len(l.Warnings) {
				t.Errorf("%d log lines for %d warnings", len(logged), len(l.Warnings))
			}
			for _, line := range logged {
				if !strings.Contains(line, `"path"=`) {
					t.Errorf("log line without path: %s", line)
				}
			}
			if tc.check != nil {
				tc.check(t, l)
			}
		})
	}
}

// faultFS fails reads of chosen files with chosen errors.
type faultFS struct {
	fs.FS
	faults map[string]error
}

func (f faultFS) Open(name string) (fs.File, error) {
	if err := f.faults[name]; err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return f.FS.Open(name)
}

func (f faultFS) ReadLink(name string) (string, error) { return fs.ReadLink(f.FS, name) }

func (f faultFS) Lstat(name string) (fs.FileInfo, error) { return fs.Lstat(f.FS, name) }

func TestReadErrors(t *testing.T) {
	root := fixture(sysfixture.HGX8GPU)
	base := Options{FS: faultFS{FS: os.DirFS(root)}, NodeRoot: "/"}
	clean, err := Discover(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	if clean.GPUSource != GPUSourceSysfs || len(clean.Warnings) != 0 || clean.Rails != 8 {
		t.Fatalf("through fs.FS: source %s, %d rails, warnings %q", clean.GPUSource, clean.Rails, clean.Warnings)
	}
	opts := base
	opts.FS = faultFS{FS: os.DirFS(root), faults: map[string]error{
		hgxMLX51 + "/ports/1/gids/7": syscall.EINVAL, // an unused RoCE entry
		hgxMLX53 + "/ports/1/state":  syscall.EIO,
		hgxGPU0 + "/class":           syscall.EACCES,
	}}
	l, err := Discover(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/" + hgxMLX53 + "/ports/1/state: unreadable: input/output error",
		"/" + hgxGPU0 + "/class: unreadable: permission denied",
	}
	if !reflect.DeepEqual(l.Warnings, want) {
		t.Errorf("warnings:\n %s\nwant\n %s", strings.Join(l.Warnings, "\n "), strings.Join(want, "\n "))
	}
	if len(l.GPUs) != 7 || hcaNamed(l, "mlx5_3").State != StateUnknown {
		t.Errorf("%d GPUs, mlx5_3 %+v", len(l.GPUs), hcaNamed(l, "mlx5_3"))
	}
	if got := hcaNamed(l, "mlx5_1").Ports[0].GIDs; len(got) != 4 {
		t.Errorf("mlx5_1 GIDs %q, want the 4 set entries", got)
	}
}

// TestRelocatedFixture discovers a copy of the committed 8-GPU tree: its
// links are relative, so the copy must read the same.
func TestRelocatedFixture(t *testing.T) {
	orig, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPU)})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := Discover(context.Background(), Options{NodeRoot: copyFixture(t, sysfixture.HGX8GPU)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(orig, moved) {
		t.Errorf("a copied tree reads differently")
	}
}

func TestResolve(t *testing.T) {
	root := fixture(sysfixture.HGX8GPU)
	var warnings []string
	s := newSysfs(os.DirFS(root), "", root, funcr.New(func(string, string) {}, funcr.Options{}), &warnings)
	tests := []struct{ in, want string }{
		{"sys/class/infiniband/mlx5_0", hgxMLX50},
		{"sys/class/infiniband/mlx5_0/device", "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"},
		{"sys/class/infiniband/mlx5_0/device/../0000:19:00.0/infiniband", strings.TrimSuffix(hgxMLX50, "/mlx5_0")},
		{"sys/bus/pci/devices/0000:18:00.0", hgxGPU0},
		{"sys/class/net/ibp25s0/device", "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"},
		{"../../sys/./bus", "sys/bus"},
		{"", "."},
	}
	for _, tc := range tests {
		got, err := s.resolve(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := s.resolve("sys/class/infiniband/mlx5_42"); err == nil {
		t.Error("resolving a missing path succeeded")
	}
}
