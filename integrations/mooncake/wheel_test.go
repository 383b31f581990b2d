// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// wheelScript runs hack/mooncake-wheel.sh with args and returns its stdout.
func wheelScript(ctx context.Context, root, tree string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "mooncake-wheel.sh"), args...)
	cmd.Env = append(os.Environ(), "MOONCAKE_TREE="+tree)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/mooncake-wheel.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// needPython checks the interpreter the wheel is built for and the Python
// packages the test installs and runs it with.
func needPython(t *testing.T) string {
	t.Helper()
	python := os.Getenv("PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	out, err := exec.Command(python, "-c", "import installer, pytest, venv").CombinedOutput()
	if err != nil {
		testtools.Missing(t, "%s cannot import installer, pytest and venv (hack/host-packages.sh install mooncake): %v\n%s", python, err, out)
	}
	return python
}

// moduleSetup finds what the module's tests need: the checkout, a Mooncake
// tree that holds the module's sources, a Python with the Debian packages
// the tests use, and the engine's build configurations.
func moduleSetup(t *testing.T) (root, tree, python string, configs []string) {
	t.Helper()
	root = repoRoot(t)
	tree = mooncakeTree(t, root)
	if _, err := os.Stat(filepath.Join(tree, "mooncake-integration", "CMakeLists.txt")); err != nil {
		testtools.Missing(t, "the Mooncake tree at %s has no mooncake-integration (%v): the module cannot be built from it", tree, err)
	}
	python = needPython(t)
	out, err := mooncakeScript(context.Background(), root, tree, "configs")
	if err != nil {
		t.Fatal(err)
	}
	return root, tree, python, strings.Fields(out)
}

// TestMooncakeWheel takes each configuration's wheel of Mooncake's Python
// module with PXN's transport (make mooncake-wheel), checks that it is laid
// out as Mooncake's own with libpxn.so where the module's RUNPATH finds it,
// installs it into a virtual environment and runs python/'s tests there
// with pytest, one subtest per Python test.
func TestMooncakeWheel(t *testing.T) {
	root, tree, python, configs := moduleSetup(t)
	ctx := context.Background()
	for _, cfg := range configs {
		t.Run(cfg, func(t *testing.T) {
			whl, err := wheelScript(ctx, root, tree, "path", cfg)
			if err != nil {
				testtools.Missing(t, "no %s wheel (make mooncake-wheel builds it): %v", cfg, err)
			}
			version, err := wheelScript(ctx, root, tree, "version", cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Run("layout", func(t *testing.T) { checkWheel(t, whl, version) })
			venv := filepath.Join(t.TempDir(), "venv")
			cmd := exec.Command(filepath.Join(root, "hack", "mooncake-wheel.sh"), "install", whl, venv)
			cmd.Env = append(os.Environ(), "PYTHON="+python)
			if o, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("installing %s: %v\n%s", whl, err, o)
			}
			runPytest(t, filepath.Join(venv, "bin", "python"), []string{filepath.Join(root, "integrations", "mooncake", "python", "test_engine.py")}, nil)
		})
	}
}

// checkWheel reads the wheel as an archive: the files of Mooncake's package,
// one compiled module whose RUNPATH is its own folder and which carries the
// PXN transport, libasio.so and libpxn.so beside it, and the version.
func checkWheel(t *testing.T, whl, version string) {
	t.Helper()
	zr, err := zip.OpenReader(whl)
	if err != nil {
		t.Fatalf("open wheel %s: %v", whl, err)
	}
	defer zr.Close()
	files := map[string]*zip.File{}
	var engines, names []string
	for _, f := range zr.File {
		files[f.Name] = f
		names = append(names, f.Name)
		if dir, base := path.Split(f.Name); dir == "mooncake/" && strings.HasPrefix(base, "engine") && strings.HasSuffix(base, ".so") {
			engines = append(engines, f.Name)
		}
	}
	t.Logf("%s:\n%s", filepath.Base(whl), strings.Join(names, "\n"))
	for _, want := range []string{"mooncake/__init__.py", "mooncake/buffer_pool.py", "mooncake/libasio.so", "mooncake/libpxn.so"} {
		if files[want] == nil {
			t.Errorf("the wheel has no %s", want)
		}
	}
	if len(engines) != 1 {
		t.Fatalf("the wheel has %d mooncake/engine*.so, want 1: %q", len(engines), engines)
	}

	engine := readELF(t, files[engines[0]])
	runpath, err := engine.DynString(elf.DT_RUNPATH)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(runpath, []string{"$ORIGIN"}) {
		t.Errorf("%s has RUNPATH %q, want [$ORIGIN]: libasio.so and libpxn.so beside it would not be the ones loaded", engines[0], runpath)
	}
	needed, err := engine.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(needed, "libasio.so") {
		t.Errorf("%s needs %q, not libasio.so", engines[0], needed)
	}
	raw := readAll(t, files[engines[0]])
	if !bytes.Contains(raw, []byte("PxnRdmaTransport was compiled with other Mooncake")) {
		t.Errorf("%s does not carry PXN's transport (no layout check message in it)", engines[0])
	}

	if lib := files["mooncake/libpxn.so"]; lib != nil {
		syms, err := readELF(t, lib).DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(syms, func(s elf.Symbol) bool { return s.Name == "pxn_open" }) {
			t.Errorf("mooncake/libpxn.so exports no pxn_open")
		}
	}

	if !strings.Contains(filepath.Base(whl), "-"+version+"-") {
		t.Errorf("wheel %s is not of version %s", filepath.Base(whl), version)
	}
	if !strings.Contains(version, "+pxn.") || !strings.Contains(version, ".mc") {
		t.Errorf("version %s does not say it carries PXN and which Mooncake commit", version)
	}
	var metadata *zip.File
	for name, f := range files {
		if strings.HasSuffix(name, ".dist-info/METADATA") {
			metadata = f
		}
	}
	if metadata == nil {
		t.Fatal("the wheel has no .dist-info/METADATA")
	}
	if m := string(readAll(t, metadata)); !strings.Contains(m, "\nVersion: "+version+"\n") {
		t.Errorf("METADATA does not say Version: %s:\n%s", version, m)
	}
}

func readAll(t *testing.T, f *zip.File) []byte {
	t.Helper()
	r, err := f.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", f.Name, err)
	}
	return b
}

func readELF(t *testing.T, f *zip.File) *elf.File {
	t.Helper()
	e, err := elf.NewFile(bytes.NewReader(readAll(t, f)))
	if err != nil {
		t.Fatalf("%s is not ELF: %v", f.Name, err)
	}
	return e
}

// junit is the part of pytest's --junitxml report the test reads: one
// <testsuites> holding <testsuite> elements.
type junit struct {
	Suites []struct {
		Cases []struct {
			Name       string `xml:"name,attr"`
			Properties []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"properties>property"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// runPytest runs the Python tests in paths with python (the environment's,
// where the wheel is installed), in a scratch folder, without the MC_
// settings of this environment and with env added, and reports each as a
// subtest.
func runPytest(t *testing.T, python string, paths, env []string) {
	t.Helper()
	work := t.TempDir()
	report := filepath.Join(work, "report.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q",
		"--junitxml=" + report, "-o", "junit_family=xunit1"}, paths...)
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Dir = work
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Env = append(cmd.Env, env...)
	out, runErr := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("pytest ran past its deadline\n%s", lastLines(string(out), 60))
	}
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("pytest wrote no report (%v): %v\n%s", runErr, err, lastLines(string(out), 60))
	}
	var r junit
	if err := xml.Unmarshal(raw, &r); err != nil {
		t.Fatalf("pytest's report %s: %v", report, err)
	}
	cases := 0
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			cases++
			t.Run(c.Name, func(t *testing.T) {
				for _, p := range c.Properties {
					t.Logf("%s = %s", p.Name, p.Value)
				}
				switch {
				case c.Failure != nil:
					t.Errorf("%s\n%s", c.Failure.Message, c.Failure.Text)
				case c.Error != nil:
					t.Errorf("%s\n%s", c.Error.Message, c.Error.Text)
				case c.Skipped != nil:
					testtools.Missing(t, "%s", c.Skipped.Message)
				}
			})
		}
	}
	if cases == 0 {
		t.Fatalf("pytest ran no test (%v)\n%s", runErr, lastLines(string(out), 60))
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("pytest failed though every test passed: %v\n%s", runErr, lastLines(string(out), 60))
	}
}

// TestMooncakeImage lays the default wheel and libpxn.so over a small local
// base image (hack/image's pause image) as hack/mooncake-wheel.sh image does
// for a serving image, and reads the archive back: the base's layer kept
// first, and one layer holding the wheel's files in the site-packages folder
// of the wheel's Python, byte for byte, and libpxn.so in /usr/local/lib.
func TestMooncakeImage(t *testing.T) {
	root, tree, whl := defaultWheel(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.tar")
	cmd := exec.Command("go", "run", "./hack/image", "-pause", "-format", "oci", "-o", base, "-name", "base:1")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("base image: %v\n%s", err, out)
	}
	img := filepath.Join(dir, "image.tar")
	site := "/opt/python/site"
	cmd = exec.Command(filepath.Join(root, "hack", "mooncake-wheel.sh"), "image", base, img)
	cmd.Env = append(os.Environ(), "MOONCAKE_TREE="+tree, "PYTHON_SITE="+site, "IMAGE_NAME=pxn-mooncake:test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("image: %v\n%s", err, out)
	}

	baseLayers, _ := ociLayers(t, base)
	layers, name := ociLayers(t, img)
	if name != "docker.io/library/pxn-mooncake:test" {
		t.Errorf("image name %q", name)
	}
	if len(layers) != len(baseLayers)+1 || !bytes.Equal(layers[0], baseLayers[0]) {
		t.Fatalf("%d layers, want the base's %d unchanged and one more", len(layers), len(baseLayers))
	}
	got := tarFiles(t, layers[len(layers)-1])

	zr, err := zip.OpenReader(whl)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	want := map[string][]byte{}
	for _, f := range zr.File {
		want[strings.TrimPrefix(site, "/")+"/"+f.Name] = readAll(t, f)
	}
	lib := want[strings.TrimPrefix(site, "/")+"/mooncake/libpxn.so"]
	if lib == nil {
		t.Fatal("the wheel has no mooncake/libpxn.so")
	}
	want["usr/local/lib/libpxn.so"] = lib
	for name, data := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("the layer has no %s", name)
		} else if !bytes.Equal(g, data) {
			t.Errorf("%s differs from the wheel's", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("the layer holds %s, which is neither the wheel's nor libpxn.so", name)
		}
	}
}

// ociLayers returns the layers of a one-image OCI archive, bottom first, and
// the name containerd would store it under.
func ociLayers(t *testing.T, p string) ([][]byte, string) {
	t.Helper()
	files := tarFiles(t, mustRead(t, p))
	blob := func(digest string) []byte {
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("%s: no blob %s", p, digest)
		}
		return b
	}
	var idx struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("%s: index.json %s: %v", p, files["index.json"], err)
	}
	var m struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(blob(idx.Manifests[0].Digest), &m); err != nil {
		t.Fatalf("%s: manifest: %v", p, err)
	}
	var layers [][]byte
	for _, l := range m.Layers {
		layers = append(layers, blob(l.Digest))
	}
	return layers, idx.Manifests[0].Annotations["io.containerd.image.name"]
}

// tarFiles returns the regular files of a tar stream by name.
func tarFiles(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// defaultWheel is the repository, the Mooncake tree and the default
// configuration's wheel built from it; the test stops as missing a tool
// when the wheel is not built.
func defaultWheel(t *testing.T) (root, tree, whl string) {
	t.Helper()
	root = repoRoot(t)
	tree = mooncakeTree(t, root)
	whl, err := wheelScript(context.Background(), root, tree, "path", "default")
	if err != nil {
		testtools.Missing(t, "no default wheel (make mooncake-wheel builds it): %v", err)
	}
	return root, tree, whl
}
