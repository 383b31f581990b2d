// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildPause compiles the pause program as a static binary.
func buildPause(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pausePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	return bin
}

// readTar returns the archive's entries in order and their contents.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(r)
	var hdrs []*tar.Header
	data := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, data
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := data[h.Name]; dup {
			t.Errorf("tar entry %s appears twice", h.Name)
		}
		hdrs = append(hdrs, h)
		data[h.Name] = b
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blobAt returns the blob stored under path and checks that the path names
// the blob's digest.
func blobAt(t *testing.T, files map[string][]byte, path string) []byte {
	t.Helper()
	b, ok := files[path]
	if !ok {
		t.Fatalf("archive has no %s", path)
	}
	if want := "blobs/sha256/" + strings.TrimPrefix(sha(b), "sha256:"); path != want {
		t.Fatalf("blob %s has digest %s", path, sha(b))
	}
	return b
}

func checkDescriptor(t *testing.T, files map[string][]byte, d descriptor, mediaType string) []byte {
	t.Helper()
	if d.MediaType != mediaType {
		t.Errorf("descriptor %s: media type %q, want %q", d.Digest, d.MediaType, mediaType)
	}
	b := blobAt(t, files, "blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:"))
	if int64(len(b)) != d.Size {
		t.Errorf("descriptor %s: size %d, blob has %d bytes", d.Digest, d.Size, len(b))
	}
	return b
}

type layerFile struct {
	hdr  *tar.Header
	data []byte
}

// checkLayer verifies the layer's determinism rules and returns its entries.
func checkLayer(t *testing.T, layer []byte, mtime time.Time) map[string]layerFile {
	t.Helper()
	hdrs, data := readTar(t, bytes.NewReader(layer))
	names := make([]string, len(hdrs))
	out := map[string]layerFile{}
	for i, h := range hdrs {
		names[i] = strings.TrimSuffix(h.Name, "/")
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d/%d (%q/%q), want 0/0", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, mtime)
		}
		if strings.HasPrefix(h.Name, "/") || strings.Contains(h.Name, "..") {
			t.Errorf("layer entry name %q is not relative and clean", h.Name)
		}
		out[names[i]] = layerFile{h, data[h.Name]}
	}
	if !slices.IsSorted(names) {
		t.Errorf("layer entries not sorted: %v", names)
	}
	for _, n := range names {
		if dir := filepath.Dir(n); dir != "." {
			if p, ok := out[dir]; !ok || p.hdr.Typeflag != tar.TypeDir {
				t.Errorf("parent %s of %s missing from the layer", dir, n)
			}
		}
	}
	return out
}

func TestDockerArchive(t *testing.T) {
	pause := buildPause(t)
	dir := t.TempDir()
	text := filepath.Join(dir, "rails.json")
	if err := os.WriteFile(text, []byte(`{"mlx5_0":"rail0"}`), 0o666); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := run([]string{"-o", out, "-name", "example.com/pxn/test:0.1.0", "-epoch", "1700000000",
		"-add", pause + ":/usr/local/bin/pause",
		"-add", text + ":/etc/pxn/rails.json:0600",
		"-entrypoint", "/usr/local/bin/pause", "-cmd", "--flag", "-env", "PATH=/usr/local/bin:/usr/bin:/bin",
		"-user", "65532:65532", "-label", "org.opencontainers.image.source=pxn"})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, files := readTar(t, f)

	var ms []dockerManifest
	if err := json.Unmarshal(files["manifest.json"], &ms); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(ms) != 1 || len(ms[0].Layers) != 1 || !slices.Equal(ms[0].RepoTags, []string{"example.com/pxn/test:0.1.0"}) {
		t.Fatalf("manifest.json: %+v", ms)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blobAt(t, files, ms[0].Config), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	layer := blobAt(t, files, ms[0].Layers[0])
	if !slices.Equal(cfg.RootFS.DiffIDs, []string{sha(layer)}) || cfg.RootFS.Type != "layers" {
		t.Errorf("config rootfs %+v, want the layer's digest %s", cfg.RootFS, sha(layer))
	}
	if cfg.OS != "linux" || cfg.Architecture == "" || cfg.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("config os %q arch %q created %q", cfg.OS, cfg.Architecture, cfg.Created)
	}
	c := cfg.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/pause"}) || !slices.Equal(c.Cmd, []string{"--flag"}) ||
		!slices.Equal(c.Env, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}) || c.User != "65532:65532" ||
		c.Labels["org.opencontainers.image.source"] != "pxn" {
		t.Errorf("config %+v", c)
	}

	entries := checkLayer(t, layer, time.Unix(1700000000, 0))
	want, err := os.ReadFile(pause)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		typ  byte
		mode int64
	}{
		{"usr/local/bin/pause", tar.TypeReg, 0o755},
		{"etc/pxn/rails.json", tar.TypeReg, 0o600},
		{"etc/passwd", tar.TypeReg, 0o644},
		{"etc/group", tar.TypeReg, 0o644},
		{"tmp", tar.TypeDir, 0o1777},
		{"usr/local/bin", tar.TypeDir, 0o755},
	} {
		e, ok := entries[tc.name]
		if !ok {
			t.Errorf("layer lacks %s", tc.name)
			continue
		}
		if e.hdr.Typeflag != tc.typ || e.hdr.Mode != tc.mode {
			t.Errorf("%s: type %c mode %o, want %c %o", tc.name, e.hdr.Typeflag, e.hdr.Mode, tc.typ, tc.mode)
		}
	}
	if !bytes.Equal(entries["usr/local/bin/pause"].data, want) {
		t.Errorf("usr/local/bin/pause differs from the built binary")
	}
	if !strings.Contains(string(entries["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd lacks the nonroot user:\n%s", entries["etc/passwd"].data)
	}
}

func TestOCIArchive(t *testing.T) {
	pause := buildPause(t)
	out := filepath.Join(t.TempDir(), "pause.tar")
	if err := run([]string{"-o", out, "-name", "pause", "-format", "oci", "-add", pause + ":/pause", "-etc=false",
		"-entrypoint", "/pause"}); err != nil {
		t.Fatalf("run: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, files := readTar(t, f)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %q", files["oci-layout"])
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %+v", idx)
	}
	md := idx.Manifests[0]
	if md.Annotations["io.containerd.image.name"] != "docker.io/library/pause:latest" ||
		md.Annotations["org.opencontainers.image.ref.name"] != "latest" {
		t.Errorf("index annotations %v", md.Annotations)
	}
	var m manifest
	if err := json.Unmarshal(checkDescriptor(t, files, md, mediaTypeManifest), &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(checkDescriptor(t, files, m.Config, mediaTypeConfig), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("manifest layers %+v", m.Layers)
	}
	layer := checkDescriptor(t, files, m.Layers[0], mediaTypeLayer)
	if !slices.Equal(cfg.RootFS.DiffIDs, []string{m.Layers[0].Digest}) {
		t.Errorf("diff_ids %v, want the layer digest %s", cfg.RootFS.DiffIDs, m.Layers[0].Digest)
	}
	entries := checkLayer(t, layer, time.Unix(0, 0))
	if len(entries) != 1 || entries["pause"].hdr.Mode != 0o755 {
		t.Errorf("layer entries %v, want only /pause with mode 0755", entries)
	}
}

func TestDeterministic(t *testing.T) {
	pause := buildPause(t)
	dir := t.TempDir()
	var sums []string
	for i, format := range []string{"docker", "docker", "oci", "oci"} {
		// Touching the input changes its mtime, which must not show.
		now := time.Now().Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(pause, now, now); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, format+string(rune('a'+i))+".tar")
		if err := run([]string{"-o", out, "-name", "pxn:0.1.0", "-format", format, "-add", pause + ":/usr/local/bin/pause"}); err != nil {
			t.Fatalf("run: %v", err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sha(b))
	}
	if sums[0] != sums[1] || sums[2] != sums[3] {
		t.Errorf("archives of the same input differ: %v", sums)
	}
}

func TestSharedLibraries(t *testing.T) {
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skipf("skipping: no ldd: %v", err)
	}
	var bin string
	for _, p := range []string{"/bin/true", "/usr/bin/true", "/bin/ls"} {
		if dyn, err := isDynamicELF(p); err == nil && dyn {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("skipping: no dynamically linked executable found")
	}
	pause := buildPause(t)
	libs, err := sharedLibraries([]File{{Src: bin, Dst: "/bin/prog"}, {Src: pause, Dst: "/pause"}})
	if err != nil {
		t.Fatalf("sharedLibraries: %v", err)
	}
	var libc, loader bool
	for _, l := range libs {
		libc = libc || filepath.Base(l.Dst) == "libc.so.6"
		loader = loader || strings.HasPrefix(filepath.Base(l.Dst), "ld-")
		if fi, err := os.Lstat(l.Src); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s -> %s is not a regular file (%v)", l.Dst, l.Src, err)
		}
	}
	if !libc || !loader {
		t.Errorf("libraries of %s lack libc or the loader: %+v", bin, libs)
	}
}

func TestRejects(t *testing.T) {
	pause := buildPause(t)
	out := filepath.Join(t.TempDir(), "x.tar")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no output", []string{"-name", "x", "-add", pause + ":/x"}, "-o and -name"},
		{"relative destination", []string{"-o", out, "-name", "x", "-add", pause + ":x"}, "absolute DST"},
		{"bad mode", []string{"-o", out, "-name", "x", "-add", pause + ":/x:0999"}, "octal"},
		{"upper-case name", []string{"-o", out, "-name", "PXN:1", "-add", pause + ":/x"}, "bad path component"},
		{"digest reference", []string{"-o", out, "-name", "pxn@sha256:00", "-add", pause + ":/x"}, "want NAME[:TAG]"},
		{"bad format", []string{"-o", out, "-name", "x", "-format", "zip", "-add", pause + ":/x"}, "format"},
		{"file over a folder", []string{"-o", out, "-name", "x", "-add", pause + ":/a", "-add", pause + ":/a/b"}, "is a file and a parent"},
		{"nothing to pack", []string{"-o", out, "-name", "x", "-etc=false"}, "nothing to pack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed run left %s behind (%v)", out, err)
	}
}

// TestPauseExitsOnSIGTERM runs the pause binary and stops it as a runtime
// does. A SIGTERM that lands before main has installed its handler kills the
// process by the default action, so each attempt waits longer before
// signalling; one clean exit passes.
func TestPauseExitsOnSIGTERM(t *testing.T) {
	bin := buildPause(t)
	if dyn, err := isDynamicELF(bin); err != nil || dyn {
		t.Fatalf("pause binary is dynamic=%v (%v), want static", dyn, err)
	}
	for attempt := range 8 {
		cmd := exec.Command(bin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Fatalf("pause exited unprompted: %v", err)
		case <-time.After(time.Duration(10<<attempt) * time.Millisecond):
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil {
				return
			}
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM {
				continue
			}
			t.Fatalf("pause exited with %v, want status 0", err)
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("pause did not exit on SIGTERM")
		}
	}
	t.Fatal("pause never exited 0 on SIGTERM")
}
