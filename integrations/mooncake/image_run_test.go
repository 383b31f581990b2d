// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"archive/zip"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// stdlibSkipped are the standard library's folders a base image that only
// imports mooncake.engine leaves out.
var stdlibSkipped = []string{"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3",
	"ensurepip", "pydoc_data", "site-packages", "dist-packages", "__pycache__"}

// pythonBase packs a small base image with python's interpreter, its
// standard library (the .py files zipped where the interpreter looks for
// pythonXY.zip, os.py as its landmark, lib-dynload's extension modules) and
// the shared libraries the wheel's module needs (ldd's view of it on this
// machine, the wheel's own libasio.so and libpxn.so left out), each with
// its closure (hack/image -ldd).
func pythonBase(t *testing.T, root, python, module, out string) {
	t.Helper()
	q := func(expr string) string {
		o, err := exec.Command(python, "-c", "import sys, sysconfig; print("+expr+")").Output()
		if err != nil {
			t.Fatalf("%s: %v", python, err)
		}
		return strings.TrimSpace(string(o))
	}
	exe, err := filepath.EvalSymlinks(q("sys.executable"))
	if err != nil {
		t.Fatal(err)
	}
	stdlib, dynload, ver := q(`sysconfig.get_paths()["stdlib"]`), q(`sysconfig.get_config_var("DESTSHARED")`), q(`"%d%d" % sys.version_info[:2]`)
	zipPath := filepath.Join(filepath.Dir(out), "python"+ver+".zip")
	zipStdlib(t, stdlib, zipPath)

	args := []string{"run", "./hack/image", "-format", "oci", "-o", out, "-name", "pxn-python-base:test", "-ldd",
		"-add", exe + ":/usr/bin/python3",
		"-add", zipPath + ":" + filepath.Join(filepath.Dir(stdlib), "python"+ver+".zip"),
		"-add", filepath.Join(stdlib, "os.py") + ":" + filepath.Join(stdlib, "os.py"),
	}
	exts, err := filepath.Glob(filepath.Join(dynload, "*.so"))
	if err != nil || len(exts) == 0 {
		t.Fatalf("no extension modules in %s (%v)", dynload, err)
	}
	for _, e := range exts {
		args = append(args, "-add", e+":"+e)
	}
	for _, lib := range moduleLibraries(t, module) {
		// As -ldd adds a library: its file's content at the path ldd names.
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-add", real+":"+lib)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./hack/image (the Python base): %v\n%s", err, o)
	}
}

func zipStdlib(t *testing.T, stdlib, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != stdlib && slices.Contains(stdlibSkipped, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".py") || !d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(stdlib, p)
		w, err := zw.Create(filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(w, src)
		return err
	})
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		t.Fatalf("zipping %s: %v", stdlib, err)
	}
}

// moduleLibraries are the paths ldd resolves for module's needs, but
// those the wheel ships beside it.
func moduleLibraries(t *testing.T, module string) []string {
	t.Helper()
	out, err := exec.Command("ldd", module).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", module, err)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		name, path, ok := strings.Cut(strings.TrimSpace(sc.Text()), " => ")
		if !ok || name == "libasio.so" || name == "libpxn.so" {
			continue
		}
		path, _, _ = strings.Cut(path, " (")
		if path == "not found" {
			t.Fatalf("ldd %s: %s not found\n%s", module, name, out)
		}
		libs = append(libs, path)
	}
	return libs
}

// wheelModule writes the wheel's mooncake/engine*.so into dir.
func wheelModule(t *testing.T, whl, dir string) string {
	t.Helper()
	zr, err := zip.OpenReader(whl)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	for _, f := range zr.File {
		if d, base := filepath.Split(f.Name); d == "mooncake/" && strings.HasPrefix(base, "engine") && strings.HasSuffix(base, ".so") {
			p := filepath.Join(dir, base)
			if err := os.WriteFile(p, readAll(t, f), 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("%s has no mooncake/engine*.so", whl)
	return ""
}

// A containerd of the test's own: its root, state and socket in one folder.
type containerd struct {
	dir, ctr string
	cmd      *exec.Cmd
	log      *os.File
}

// startContainerd starts containerd with the CRI plugins off and waits for
// its socket; a containerd that cannot start here skips the test.
func startContainerd(t *testing.T, root string) *containerd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: running a container needs root (containerd and runc)")
	}
	path := func(tool string) string {
		cmd := exec.Command(filepath.Join(root, "hack", "tools.sh"), "path", tool)
		out, err := cmd.Output()
		p := strings.TrimSpace(string(out))
		if err != nil || p == "" {
			testtools.Missing(t, "no %s (hack/tools.sh builds it): %v", tool, err)
		}
		if _, err := os.Stat(p); err != nil {
			testtools.Missing(t, "no %s at %s (hack/tools.sh builds it)", tool, p)
		}
		return p
	}
	bin, ctr := path("containerd"), path("ctr")
	if _, err := exec.LookPath("runc"); err != nil {
		testtools.Missing(t, "runc not found (hack/host-packages.sh install cluster)")
	}
	// A short folder: the socket's path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "pxn-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &containerd{dir: dir, ctr: ctr}
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock(), c.sock()+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.log, err = os.Create(filepath.Join(dir, "containerd.log")); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	// Its own shim ahead of any other in PATH.
	c.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting containerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	t.Cleanup(func() { c.stop(t, exited) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.run(10*time.Second, "version"); err == nil {
			return c
		}
		select {
		case err := <-exited:
			exited <- err
			t.Skipf("skipping: containerd cannot start here (%v):\n%s", err, c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Skipf("skipping: containerd did not answer within 30 s:\n%s", c.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *containerd) sock() string { return filepath.Join(c.dir, "containerd.sock") }

func (c *containerd) logTail() string {
	b, _ := os.ReadFile(c.log.Name())
	return lastLines(string(b), 20)
}

// run runs ctr against this containerd, in the test's namespace.
func (c *containerd) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.ctr, append([]string{"--address", c.sock(), "-n", "pxn-image-test"}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("ran past %s: %w", timeout, ctx.Err())
	}
	return string(out), err
}

// stop ends containerd and removes its folder, unmounting what it left
// mounted there.
func (c *containerd) stop(t *testing.T, exited chan error) {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-exited
	}
	c.log.Close()
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var under []string
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], c.dir+"/") {
				under = append(under, f[4])
			}
		}
		slices.Reverse(under)
		for _, m := range under {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", m, err)
			}
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		t.Errorf("removing containerd's folder: %v", err)
	}
}

// TestMooncakeImageRuns builds the image of make mooncake-image over a
// small base with a Python 3 (this machine's interpreter, its standard
// library and the libraries the module needs, packed by hack/image),
// imports it into a containerd the test starts, and runs python3 -c
// "import mooncake.engine" in a container of it with runc: the module
// found in the wheel's site folder loads with the libasio.so beside it.
// Where no container can run here the test skips and says why.
func TestMooncakeImageRuns(t *testing.T) {
	root, tree, whl := defaultWheel(t)
	python := needPython(t)
	c := startContainerd(t, root)

	dir := t.TempDir()
	module := wheelModule(t, whl, dir)
	base := filepath.Join(dir, "base.tar")
	pythonBase(t, root, python, module, base)
	img := filepath.Join(dir, "image.tar")
	cmd := exec.Command(filepath.Join(root, "hack", "mooncake-wheel.sh"), "image", base, img)
	cmd.Env = append(os.Environ(), "MOONCAKE_TREE="+tree, "IMAGE_NAME=pxn-mooncake:run-test", "PYTHON="+python)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("image: %v\n%s", err, out)
	}
	if st, err := os.Stat(img); err == nil {
		t.Logf("image %d MiB (base and wheel)", st.Size()>>20)
	}

	if out, err := c.run(2*time.Minute, "images", "import", img); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	id := fmt.Sprintf("pxn-import-%d", os.Getpid())
	out, err := c.run(2*time.Minute, "run", "--rm", "--cgroup", "/"+id, "docker.io/library/pxn-mooncake:run-test", id,
		"/usr/bin/python3", "-c", "import mooncake.engine; print(mooncake.engine.__file__)")
	if err != nil {
		c.run(time.Minute, "tasks", "kill", "-s", "SIGKILL", id)
		c.run(time.Minute, "containers", "rm", id)
		var exit *exec.ExitError
		if errors.As(err, &exit) && strings.Contains(out, "runc") && !strings.Contains(out, "Traceback") {
			t.Skipf("skipping: runc cannot run a container here: %v\n%s", err, out)
		}
		t.Fatalf("python3 -c 'import mooncake.engine' in the image: %v\n%s", err, out)
	}
	got := strings.TrimSpace(out)
	if !strings.HasPrefix(got, "/usr/local/lib/python3") || !strings.Contains(got, "/dist-packages/mooncake/engine") {
		t.Errorf("mooncake.engine came from %q, not the wheel's site folder", got)
	}
	t.Logf("in the container: mooncake.engine is %s", got)
}
