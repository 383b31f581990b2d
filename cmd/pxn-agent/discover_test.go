// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/rail"
)

func railFixture(name string) string {
	return filepath.Join("..", "..", "pkg", "rail", "testdata", "sysfs", name)
}

func runDiscover(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = execute(context.Background(), append([]string{"discover"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

const hgxTable = `GPU  PCI BUS ID    NUMA  HCA     DISTANCE  RAIL
0    0000:18:00.0  0     mlx5_0  PIX       rail0
1    0000:3a:00.0  0     mlx5_2  PIX       rail1
2    0000:4b:00.0  0     mlx5_3  PIX       rail2
3    0000:5c:00.0  0     mlx5_4  PIX       rail3
4    0000:9a:00.0  1     mlx5_5  PIX       rail4
5    0000:ba:00.0  1     mlx5_7  PIX       rail5
6    0000:c9:00.0  1     mlx5_8  PIX       rail6
7    0000:d8:00.0  1     mlx5_9  PIX       rail7

HCA     PCI BUS ID    NUMA  PORT  LINK        STATE   PHYS STATE  RATE                 NETDEV       RAIL
mlx5_0  0000:19:00.0  0     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp25s0      rail0
mlx5_1  0000:27:00.0  0     1     Ethernet    ACTIVE  LinkUp      200 Gb/sec (4X HDR)  enp39s0np0   -
mlx5_2  0000:3b:00.0  0     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp59s0      rail1
mlx5_3  0000:4c:00.0  0     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp76s0      rail2
mlx5_4  0000:5d:00.0  0     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp93s0      rail3
mlx5_5  0000:9b:00.0  1     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp155s0     rail4
mlx5_6  0000:a9:00.0  1     1     Ethernet    ACTIVE  LinkUp      200 Gb/sec (4X HDR)  enp169s0np0  -
mlx5_7  0000:bb:00.0  1     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp187s0     rail5
mlx5_8  0000:ca:00.0  1     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp202s0     rail6
mlx5_9  0000:d9:00.0  1     1     InfiniBand  ACTIVE  LinkUp      400 Gb/sec (4X NDR)  ibp217s0     rail7

strategy pci-order, 8 rails, GPUs from sysfs; ready: yes
`

func TestDiscoverTable(t *testing.T) {
	code, out, errOut := runDiscover(t, "--host-root", railFixture("hgx-8gpu"))
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if out != hgxTable {
		t.Errorf("table:\n%s\nwant:\n%s", out, hgxTable)
	}
}

func TestDiscoverJSONIsTheLayout(t *testing.T) {
	staticTable := filepath.Join("..", "..", "pkg", "rail", "testdata", "static", "hgx-8gpu.json")
	tests := []struct {
		args []string
		opts rail.Options
	}{
		{
			[]string{"--host-root", railFixture("hgx-8gpu"), "-o", "json"},
			rail.Options{NodeRoot: railFixture("hgx-8gpu")},
		},
		{
			[]string{"--host-root", railFixture("pcie-8gpu-4nic"), "--rail-strategy", "subnet", "--subnet-prefix-len", "16", "-o", "json"},
			rail.Options{NodeRoot: railFixture("pcie-8gpu-4nic"), Strategy: "subnet", SubnetPrefixLen: 16},
		},
		{
			[]string{"--host-root", railFixture("hgx-8gpu-portdown"), "--rail-strategy=static", "--static-file", staticTable, "-o=json"},
			rail.Options{NodeRoot: railFixture("hgx-8gpu-portdown"), Strategy: "static", StaticFile: staticTable},
		},
	}
	for _, tc := range tests {
		want, err := rail.Discover(context.Background(), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		wantCode := 0
		if ready, _ := want.Ready(); !ready {
			wantCode = exitNotReady
		}
		code, out, _ := runDiscover(t, tc.args...)
		if code != wantCode {
			t.Fatalf("%q: exit %d, want %d", tc.args, code, wantCode)
		}
		var got rail.Layout
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%q: output is not a layout: %v", tc.args, err)
		}
		want.Warnings = nil
		if !reflect.DeepEqual(&got, want) {
			t.Errorf("%q: JSON output is not Discover's layout:\n%s", tc.args, out)
		}
	}
}

// TestDiscoverRailMap: -o railmap is the rail map a pod gets, and it is
// what the engine's parser reads back.
func TestDiscoverRailMap(t *testing.T) {
	code, out, errOut := runDiscover(t, "--host-root", railFixture("hgx-8gpu"), "-o", "railmap")
	want := `{"mlx5_0":"rail0","mlx5_2":"rail1","mlx5_3":"rail2","mlx5_4":"rail3","mlx5_5":"rail4","mlx5_7":"rail5","mlx5_8":"rail6","mlx5_9":"rail7"}` + "\n"
	if code != 0 || errOut != "" || out != want {
		t.Fatalf("exit %d, stderr %q, stdout %q; want %q", code, errOut, out, want)
	}
	if m, err := contract.ParseRailMap(out); err != nil || len(m) != 8 || m["mlx5_2"] != "rail1" {
		t.Errorf("ParseRailMap(%q) = %v, %v", out, m, err)
	}
}

func TestDiscoverReportsNotReady(t *testing.T) {
	code, out, errOut := runDiscover(t, "--host-root", railFixture("hgx-8gpu-portdown"))
	if code != exitNotReady || errOut != "pxn-agent discover: node not ready: not active: mlx5_3 port 1 DOWN (Disabled)\n" {
		t.Fatalf("exit %d, stderr %q; want exit %d and the reason", code, errOut, exitNotReady)
	}
	if code, _, errOut := runDiscover(t, "--host-root", railFixture("hgx-8gpu-portdown"), "-o", "json"); code != exitNotReady || !strings.Contains(errOut, "node not ready") {
		t.Errorf("-o json: exit %d, stderr %q; want exit %d", code, errOut, exitNotReady)
	}
	for _, want := range []string{
		"mlx5_3  0000:4c:00.0  0     1     InfiniBand  DOWN    Disabled    10 Gb/sec (4X SDR)   ibp76s0      rail2",
		"ready: no (not active: mlx5_3 port 1 DOWN (Disabled))",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestDiscoverWarningsGoToStderr(t *testing.T) {
	root := t.TempDir()
	code, out, errOut := runDiscover(t, "--host-root", root)
	if code != exitNotReady {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := "pxn-agent discover: node not ready: no GPU and no HCA under " + filepath.Join(root, "sys") + ": is --host-root the folder where the host's / is visible?\n"; !strings.HasSuffix(errOut, want) {
		t.Errorf("stderr does not end with %q:\n%s", want, errOut)
	}
	for _, want := range []string{
		"pxn-agent discover: warning: " + filepath.Join(root, "sys/class/infiniband") + ": missing: no RDMA devices\n",
		"pxn-agent discover: warning: " + filepath.Join(root, "sys/bus/pci/devices") + ": unreadable, so no GPUs",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, "ready: no (no HCA is on a rail); 2 warnings on stderr") {
		t.Errorf("summary:\n%s", out)
	}
}

func TestDiscoverErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"mlx5_0": 7}`), 0o644); err != nil {
		t.Fatal(err)
	}
	root := railFixture("hgx-8gpu")
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"--host-root", root, "--rail-strategy", "nearest"}, 1, `pxn-agent discover: rail strategy "nearest": want pci-order, subnet or static`},
		{[]string{"--host-root", root, "--rail-strategy", "static"}, 1, "static rail strategy needs a static file"},
		{[]string{"--host-root", root, "--rail-strategy", "static", "--static-file", bad}, 1, `HCA "mlx5_0" maps to a number, want a string`},
		{[]string{"--host-root", root, "--rail-strategy", "subnet", "--subnet-prefix-len", "40"}, 1, "subnet prefix length 40: want 1..32"},
		{[]string{"--host-root", filepath.Join(dir, "missing")}, 1, "pxn-agent discover: host root: "},
		{[]string{"--host-root", root, "-o", "yaml"}, 2, `output format "yaml": want table, json or railmap`},
		{[]string{"--host-root", root, "--subnet-prefix-len", "x"}, 2, `invalid argument "x" for "--subnet-prefix-len"`},
		{[]string{"--no-such-flag"}, 2, "pxn-agent discover: unknown flag: --no-such-flag"},
		{[]string{"--host-root", root, "extra"}, 2, `unknown command "extra" for "pxn-agent discover"`},
		{[]string{"-h"}, 0, ""},
	}
	for _, tc := range tests {
		code, out, errOut := runDiscover(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.stderr)
		}
		if tc.code != 0 && out != "" {
			t.Errorf("%q: printed %q on failure", tc.args, out)
		}
	}
}
