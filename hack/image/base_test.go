// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ociImage reads a one-image OCI archive: its manifest, config and files.
func ociImage(t *testing.T, p string) (manifest, imageConfig, map[string][]byte) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, files := readTar(t, f)
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	var m manifest
	if err := json.Unmarshal(checkDescriptor(t, files, idx.Manifests[0], mediaTypeManifest), &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(checkDescriptor(t, files, m.Config, mediaTypeConfig), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	return m, cfg, files
}

// TestOverBase: a layer packed over a base image keeps the base's layers
// byte for byte, below it, and the base's configuration with the new
// settings on top.
func TestOverBase(t *testing.T) {
	dir := t.TempDir()
	pause := buildPause(t)
	base := filepath.Join(dir, "base.tar")
	if err := run([]string{"-o", base, "-name", "base:1", "-format", "oci", "-add", pause + ":/pause",
		"-entrypoint", "/pause", "-env", "PATH=/bin", "-env", "KEEP=1", "-workdir", "/srv", "-label", "from=base"}); err != nil {
		t.Fatalf("base: %v", err)
	}
	bm, bcfg, bfiles := ociImage(t, base)
	lib := filepath.Join(dir, "libx.so")
	if err := os.WriteFile(lib, []byte("library"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{FormatOCI, FormatDocker} {
		t.Run(format, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "over.tar")
			if err := run([]string{"-o", out, "-name", "over:2", "-format", format, "-base", base,
				"-add", lib + ":/usr/local/lib/libx.so", "-env", "PATH=/usr/local/bin:/bin", "-label", "added=1"}); err != nil {
				t.Fatalf("run: %v", err)
			}
			if format == FormatDocker {
				f, err := os.Open(out)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				_, files := readTar(t, f)
				var dm []dockerManifest
				if err := json.Unmarshal(files["manifest.json"], &dm); err != nil || len(dm) != 1 {
					t.Fatalf("manifest.json %s: %v", files["manifest.json"], err)
				}
				want := []string{"blobs/sha256/" + strings.TrimPrefix(bm.Layers[0].Digest, "sha256:")}
				if len(dm[0].Layers) != 2 || dm[0].Layers[0] != want[0] {
					t.Errorf("docker layers %v, want the base's %v first and one more", dm[0].Layers, want)
				}
				return
			}
			m, cfg, files := ociImage(t, out)
			if len(m.Layers) != 2 || m.Layers[0].Digest != bm.Layers[0].Digest || m.Layers[0].MediaType != bm.Layers[0].MediaType {
				t.Fatalf("layers %+v, want the base's %+v and one more", m.Layers, bm.Layers)
			}
			if got, want := files["blobs/sha256/"+strings.TrimPrefix(m.Layers[0].Digest, "sha256:")],
				bfiles["blobs/sha256/"+strings.TrimPrefix(bm.Layers[0].Digest, "sha256:")]; string(got) != string(want) {
				t.Error("the base layer's bytes changed")
			}
			entries := checkLayer(t, checkDescriptor(t, files, m.Layers[1], mediaTypeLayer), time.Unix(0, 0))
			var names []string
			for n := range entries {
				names = append(names, n)
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"usr", "usr/local", "usr/local/lib", "usr/local/lib/libx.so"}) {
				t.Errorf("new layer holds %v, want libx.so and its folders only (no /etc over the base's)", names)
			}
			if want := append(slices.Clone(bcfg.RootFS.DiffIDs), m.Layers[1].Digest); !slices.Equal(cfg.RootFS.DiffIDs, want) {
				t.Errorf("diff_ids %v, want %v", cfg.RootFS.DiffIDs, want)
			}
			if len(cfg.History) != len(bcfg.History)+1 {
				t.Errorf("history %+v, want the base's %d entries and one", cfg.History, len(bcfg.History))
			}
			rc := cfg.Config
			if !slices.Equal(rc.Env, []string{"KEEP=1", "PATH=/usr/local/bin:/bin"}) {
				t.Errorf("env %v, want KEEP=1 from the base and PATH replaced", rc.Env)
			}
			if !slices.Equal(rc.Entrypoint, []string{"/pause"}) || rc.WorkingDir != "/srv" {
				t.Errorf("entrypoint %v, workdir %q: want the base's /pause and /srv", rc.Entrypoint, rc.WorkingDir)
			}
			if rc.Labels["from"] != "base" || rc.Labels["added"] != "1" {
				t.Errorf("labels %v, want the base's and the added one", rc.Labels)
			}
		})
	}
}

func TestOverBaseRejects(t *testing.T) {
	dir := t.TempDir()
	pause := buildPause(t)
	docker := filepath.Join(dir, "docker.tar")
	if err := run([]string{"-o", docker, "-name", "d:1", "-add", pause + ":/pause"}); err != nil {
		t.Fatal(err)
	}
	arm := filepath.Join(dir, "arm.tar")
	if err := run([]string{"-o", arm, "-name", "a:1", "-format", "oci", "-arch", "arm64", "-add", pause + ":/pause"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ base, arch, want string }{
		{docker, "amd64", "index.json"},
		{arm, "amd64", "the base image is linux/arm64, the layer is for linux/amd64"},
		{filepath.Join(dir, "none.tar"), "amd64", "none.tar"},
	} {
		err := run([]string{"-o", filepath.Join(dir, "out.tar"), "-name", "o:1", "-format", "oci", "-arch", c.arch,
			"-base", c.base, "-add", pause + ":/pause"})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-base %s: got %v, want an error saying %q", c.base, err, c.want)
		}
	}
}
