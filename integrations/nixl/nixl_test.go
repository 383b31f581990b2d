// SPDX-License-Identifier: Apache-2.0

// Package nixl drives NIXL's Mooncake backend through PXN: NIXL 1.4 built
// against Mooncake's shared library with PXN's transport (make nixl builds
// both, cached in PXN_TOOLS_DIR), that library relinked with the link seam,
// and test/run.sh's four NIXL processes writing across rails through a relay.
// It is the one client of PXN here that nobody on the project wrote.
package nixl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// script runs one of the project's build scripts with the environment of
// the test (PXN_TOOLS_DIR, MOONCAKE_TREE) and returns what it printed.
func script(ctx context.Context, root string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, args[0]), args[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// shellEnv parses the NAME=VALUE lines hack/nixl.sh env prints, whose values
// may be single-quoted.
func shellEnv(out string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		env[name] = strings.Trim(value, "'")
	}
	return env
}

// goBuild runs go build in the module without -race: the
// programs are loaded by processes that are not Go's test binary.
func goBuild(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS="+testtools.WithoutRace(os.Getenv("GOFLAGS")))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// counters is run.sh's summary line of the group's counters.
var counters = regexp.MustCompile(`counters \(pxn-agent inspect, (\d+) ranks\): relayed_bytes=(\d+) relayed_pieces=(\d+) forwarded_bytes=(\d+) direct_bytes=(\d+) fallback_bytes=(\d+)`)

// checked is the target's line once it compared every byte of its buffer.
var checked = regexp.MustCompile(`target: checked (\d+) bytes \((\d+) written`)

// TestNixlMooncakeBackend runs NIXL's Mooncake backend through PXN with
// Mooncake's shared library in each configuration: NIXL is built once
// against the default one, and each configuration's library, relinked with
// the seam, is the libtransfer_engine.so it loads (the C API is the same).
// Two initiators on rails 0 and 2 write lists of odd-sized descriptors with
// notifications to a target on rail 1; every byte must reach the target
// through the relay on rail 1, none by a fallback, and the target must find
// its buffer exactly as written.
func TestNixlMooncakeBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("four NIXL processes and a relay: not in -short")
	}
	root := testtools.RepoRoot()
	for _, tool := range []string{"g++", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			testtools.Missing(t, "%s not found: hack/host-packages.sh install nixl", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := script(ctx, root, "hack/mooncake.sh", "source"); err != nil {
		testtools.Missing(t, "no Mooncake tree to build the shared library from: %v", err)
	}
	out, err := script(ctx, root, "hack/mooncake.sh", "configs")
	if err != nil {
		t.Fatal(err)
	}
	configs := strings.Fields(out)
	prefixes := map[string]string{}
	for _, cfg := range configs {
		p, err := script(ctx, root, "hack/mooncake.sh", "shared-prefix", cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(p, ".built")); err != nil {
			testtools.Missing(t, "Mooncake's shared library (%s) is not built in %s (make nixl builds it): %v", cfg, p, err)
		}
		prefixes[cfg] = p
	}
	envOut, err := script(ctx, root, "hack/nixl.sh", "env", prefixes["default"])
	if err != nil {
		testtools.Missing(t, "NIXL is not built (make nixl builds it): %v", err)
	}
	nixl := shellEnv(envOut)
	for _, name := range []string{"NIXL_PLUGIN_DIR", "NIXL_CFLAGS", "NIXL_LIBS", "NIXL_LIBPATH"} {
		if nixl[name] == "" {
			t.Fatalf("hack/nixl.sh env printed no %s:\n%s", name, envOut)
		}
	}

	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	goBuild(t, root, "-buildmode=c-shared", "-o", filepath.Join(bin, "libpxn.so"), "./cmd/libpxn")
	goBuild(t, root, "-o", filepath.Join(bin, "pxn-agent"), "./cmd/pxn-agent")
	prog := filepath.Join(work, "nixl_pxn")
	args := append(strings.Fields(nixl["NIXL_CFLAGS"]), filepath.Join(root, "integrations", "nixl", "test", "nixl_pxn.cpp"), "-o", prog)
	args = append(append([]string{"-O2"}, args...), strings.Fields(nixl["NIXL_LIBS"])...)
	if o, err := exec.CommandContext(ctx, "g++", args...).CombinedOutput(); err != nil {
		t.Fatalf("g++ %s: %v\n%s", strings.Join(args, " "), err, o)
	}

	for _, cfg := range configs {
		t.Run(cfg, func(t *testing.T) {
			seam := filepath.Join(work, "seam-"+cfg)
			if _, err := script(ctx, root, "hack/nixl.sh", "seam", prefixes[cfg], seam); err != nil {
				t.Fatal(err)
			}
			loadedFrom(t, filepath.Join(nixl["NIXL_PLUGIN_DIR"], "libplugin_Mooncake.so"),
				seam+":"+bin+":"+nixl["NIXL_LIBPATH"], filepath.Join(seam, "libtransfer_engine.so"))
			runDir := filepath.Join(work, "run-"+cfg)
			cmd := exec.CommandContext(ctx, filepath.Join(root, "integrations", "nixl", "test", "run.sh"),
				prog, seam, nixl["NIXL_PLUGIN_DIR"], bin, runDir)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+nixl["NIXL_LIBPATH"])
			o, err := cmd.CombinedOutput()
			output := string(o)
			if err != nil {
				t.Fatalf("run.sh (%s): %v\n%s", cfg, err, output)
			}
			c := counters.FindStringSubmatch(output)
			k := checked.FindStringSubmatch(readFile(t, filepath.Join(runDir, "target.log")))
			if c == nil || k == nil {
				t.Fatalf("run.sh (%s) passed without its counters or the target's check:\n%s", cfg, output)
			}
			n := func(s string) uint64 {
				v, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					t.Fatalf("%q: %v", s, err)
				}
				return v
			}
			written := n(k[2])
			relayed, forwarded, fallback := n(c[2]), n(c[4]), n(c[6])
			t.Logf("%s: target checked %s bytes, %d written; %s ranks: relayed %d bytes in %s pieces, forwarded %d, direct %s, fallback %d",
				cfg, k[1], written, c[1], relayed, c[3], forwarded, c[5], fallback)
			if written == 0 || relayed != written || forwarded != written || fallback != 0 {
				t.Errorf("%s: written %d, relayed %d, forwarded %d, fallback %d: want every written byte relayed and forwarded, none by a fallback",
					cfg, written, relayed, forwarded, fallback)
			}
		})
	}
}

// loadedFrom checks with ldd that lib, loaded with LD_LIBRARY_PATH path as
// run.sh sets it, resolves libtransfer_engine.so to want: NIXL was built
// against another configuration's library, and the one under test must be
// the one its plugin loads.
func loadedFrom(t *testing.T, lib, path, want string) {
	t.Helper()
	cmd := exec.Command("ldd", lib)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+path)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", lib, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, target, ok := strings.Cut(strings.TrimSpace(line), " => ")
		if ok && name == "libtransfer_engine.so" {
			got, _, _ := strings.Cut(target, " (")
			if got != want {
				t.Fatalf("%s loads libtransfer_engine.so from %s, want %s", lib, got, want)
			}
			return
		}
	}
	t.Fatalf("%s does not load libtransfer_engine.so:\n%s", lib, out)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
