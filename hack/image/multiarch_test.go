// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
)

// buildFor compiles the pause program for one architecture (pure Go, so no
// cross C compiler is needed).
func buildFor(t *testing.T, arch string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause-"+arch)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pausePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause for %s: %v\n%s", arch, err, out)
	}
	return bin
}

// packOCI writes a one-platform OCI archive of bin claiming architecture arch.
func packOCI(t *testing.T, dir, bin, arch string) string {
	t.Helper()
	out := filepath.Join(dir, "img-"+arch+"-"+filepath.Base(bin)+".tar")
	if err := run([]string{"-o", out, "-name", "pxn:1.2.3", "-format", "oci", "-arch", arch, "-etc=false",
		"-add", bin + ":/usr/local/bin/pxn-agent", "-entrypoint", "/usr/local/bin/pxn-agent"}); err != nil {
		t.Fatalf("pack %s: %v", arch, err)
	}
	return out
}

func TestIndexHasEveryPlatform(t *testing.T) {
	dir := t.TempDir()
	amd, arm := buildFor(t, "amd64"), buildFor(t, "arm64")
	out := filepath.Join(dir, "pxn.oci.tar")
	if err := run([]string{"-index", "-o", out, "-name", "pxn:1.2.3", packOCI(t, dir, arm, "arm64"), packOCI(t, dir, amd, "amd64")}); err != nil {
		t.Fatalf("-index: %v", err)
	}
	files, err := readArchive(out)
	if err != nil {
		t.Fatal(err)
	}
	var top platformIndex
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaTypeIndex ||
		top.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/library/pxn:1.2.3" ||
		top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.3" {
		t.Fatalf("index.json %+v: want one named image index", top)
	}
	var idx platformIndex
	if err := json.Unmarshal(checkDescriptor(t, files, descriptor{MediaType: top.Manifests[0].MediaType,
		Digest: top.Manifests[0].Digest, Size: top.Manifests[0].Size}, mediaTypeIndex), &idx); err != nil {
		t.Fatal(err)
	}
	want := []platform{{Architecture: "amd64", OS: "linux"}, {Architecture: "arm64", OS: "linux", Variant: "v8"}}
	if len(idx.Manifests) != len(want) {
		t.Fatalf("image index %+v, want %v", idx.Manifests, want)
	}
	for i, d := range idx.Manifests {
		if d.MediaType != mediaTypeManifest || d.Platform == nil || *d.Platform != want[i] {
			t.Errorf("manifest %d: %s platform %+v, want %+v", i, d.MediaType, d.Platform, want[i])
		}
		checkDescriptor(t, files, descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size}, mediaTypeManifest)
	}
	report, err := VerifyIndex(out)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if strings.Join(report, "\n") != "linux/amd64: 1 ELF files, all EM_X86_64\nlinux/arm64/v8: 1 ELF files, all EM_AARCH64" {
		t.Errorf("verify report %q", report)
	}
}

func TestIndexRejects(t *testing.T) {
	dir := t.TempDir()
	amd := buildFor(t, "amd64")

	// An amd64 binary in the image that claims arm64.
	out := filepath.Join(dir, "wrong.tar")
	if err := run([]string{"-index", "-o", out, "-name", "pxn:1", packOCI(t, dir, amd, "arm64")}); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyIndex(out); err == nil || !strings.Contains(err.Error(), "/usr/local/bin/pxn-agent is EM_X86_64, want EM_AARCH64") {
		t.Errorf("verify of a wrong-machine binary: %v", err)
	}

	// Two images of one platform.
	a := packOCI(t, dir, amd, "amd64")
	b := packOCI(t, t.TempDir(), amd, "amd64")
	if err := run([]string{"-index", "-o", filepath.Join(dir, "dup.tar"), "-name", "pxn:1", a, b}); err == nil ||
		!strings.Contains(err.Error(), "are both linux/amd64") {
		t.Errorf("two amd64 images: %v", err)
	}

	// A docker archive is not an OCI image.
	docker := filepath.Join(dir, "docker.tar")
	if err := run([]string{"-o", docker, "-name", "pxn:1", "-add", amd + ":/x"}); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-index", "-o", filepath.Join(dir, "d.tar"), "-name", "pxn:1", docker}); err == nil {
		t.Error("-index took a docker archive")
	}
}

// TestSysrootLibraries packs an arm64 C program with the libraries of
// Debian's arm64 cross C library, as the arm64 image is built.
func TestSysrootLibraries(t *testing.T) {
	const sysroot = "/usr/aarch64-linux-gnu"
	cc, err := exec.LookPath("aarch64-linux-gnu-gcc")
	if err != nil {
		testtools.Missing(t, "no aarch64-linux-gnu-gcc (hack/host-packages.sh install cross): %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "hello.c")
	if err := os.WriteFile(src, []byte("#include <math.h>\n#include <stdio.h>\nint main(int c, char **v) { printf(\"%f\\n\", sqrt(c)); return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	if out, err := exec.Command(cc, "-o", bin, src, "-lm").CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	libs, err := sysrootLibraries([]File{{Src: bin, Dst: "/hello"}}, sysroot, "arm64")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range libs {
		got[l.Dst] = true
		if !strings.HasPrefix(l.Src, sysroot+"/") {
			t.Errorf("%s taken from %s, outside the sysroot", l.Dst, l.Src)
		}
	}
	for _, w := range []string{"/lib/ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libm.so.6"} {
		if !got[w] {
			t.Errorf("libraries %v lack %s", got, w)
		}
	}
	if _, err := sysrootLibraries([]File{{Src: bin, Dst: "/hello"}}, t.TempDir(), "arm64"); err == nil ||
		!strings.Contains(err.Error(), "needs libm.so.6") && !strings.Contains(err.Error(), "needs ld-linux-aarch64.so.1") {
		t.Errorf("empty sysroot: %v", err)
	}
}
