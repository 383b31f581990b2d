// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// platform is an OCI descriptor's platform.
type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// indexDescriptor is a descriptor in an image index, with its platform.
type indexDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platformIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Manifests     []indexDescriptor `json:"manifests"`
}

// elfMachine is the ELF machine of each GOARCH the images are built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// multiarchLibDir is where Debian's loader looks for an architecture's
// libraries.
var multiarchLibDir = map[string]string{"amd64": "/lib/x86_64-linux-gnu", "arm64": "/lib/aarch64-linux-gnu"}

// sysrootLibraries is sharedLibraries for a foreign architecture: it follows
// the DT_NEEDED entries of files (and of the libraries they name) into
// sysroot/lib, as a cross toolchain installs them (Debian's
// libc6-<arch>-cross: /usr/aarch64-linux-gnu/lib). The loader goes to the
// path the binaries name as their interpreter, libraries to the
// architecture's multiarch folder, which that loader searches.
func sysrootLibraries(files []File, sysroot, arch string) ([]File, error) {
	libDir, ok := multiarchLibDir[arch]
	if !ok {
		return nil, fmt.Errorf("-sysroot: no library folder known for architecture %q", arch)
	}
	seen := map[string]bool{}
	var libs []File
	var queue []string
	for _, f := range files {
		queue = append(queue, f.Src)
	}
	for len(queue) > 0 {
		src := queue[0]
		queue = queue[1:]
		ef, err := elf.Open(src)
		if err != nil {
			var fe *elf.FormatError
			if errors.As(err, &fe) {
				continue
			}
			return nil, err
		}
		needed, err := ef.ImportedLibraries()
		var interp string
		for _, prog := range ef.Progs {
			if prog.Type == elf.PT_INTERP {
				b, rerr := io.ReadAll(prog.Open())
				if rerr != nil {
					err = errors.Join(err, rerr)
				}
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
		ef.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		type want struct{ name, dst string }
		var wants []want
		if interp != "" {
			wants = append(wants, want{path.Base(interp), interp})
		}
		for _, n := range needed {
			wants = append(wants, want{n, path.Join(libDir, n)})
		}
		for _, w := range wants {
			if seen[w.dst] {
				continue
			}
			seen[w.dst] = true
			lib := filepath.Join(sysroot, "lib", w.name)
			real, err := filepath.EvalSymlinks(lib)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: not in %s/lib: %w", src, w.name, sysroot, err)
			}
			libs = append(libs, File{Src: real, Dst: w.dst, Mode: 0o755})
			queue = append(queue, real)
		}
	}
	sort.Slice(libs, func(i, j int) bool { return libs[i].Dst < libs[j].Dst })
	return libs, nil
}

// readArchive returns the files of an image archive by name.
func readArchive(p string) (map[string][]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, hdr.Name, err)
		}
		files[hdr.Name] = b
	}
}

func blobOf(files map[string][]byte, digest string) ([]byte, error) {
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		return nil, fmt.Errorf("blob %s missing", digest)
	}
	return b, nil
}

// singleManifest reads a one-image OCI archive: its manifest descriptor and
// the platform its config names.
func singleManifest(files map[string][]byte) (descriptor, platform, error) {
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		return descriptor{}, platform{}, fmt.Errorf("index.json: %w", err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != mediaTypeManifest {
		return descriptor{}, platform{}, fmt.Errorf("index.json lists %d entries; want one image manifest (an archive of -format oci)", len(idx.Manifests))
	}
	d := idx.Manifests[0]
	mb, err := blobOf(files, d.Digest)
	if err != nil {
		return descriptor{}, platform{}, err
	}
	var m manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return descriptor{}, platform{}, fmt.Errorf("manifest: %w", err)
	}
	cb, err := blobOf(files, m.Config.Digest)
	if err != nil {
		return descriptor{}, platform{}, err
	}
	var cfg imageConfig
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return descriptor{}, platform{}, fmt.Errorf("config: %w", err)
	}
	return d, platform{Architecture: cfg.Architecture, OS: cfg.OS, Variant: cfg.Variant}, nil
}

// WriteIndex combines one-image OCI archives (one per platform) into one OCI
// layout archive whose index.json names a single image index, the one that
// lists each platform's manifest with its platform; that is what registries
// and `ctr images import` take as one multi-platform image called name.
func WriteIndex(out, name string, parts []string, mtime time.Time) (string, error) {
	_, full, tag, err := parseRef(name)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".index-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	var blobs []blob
	var entries []indexDescriptor
	platforms := map[string]string{}
	for _, p := range parts {
		files, err := readArchive(p)
		if err != nil {
			return "", err
		}
		d, plat, err := singleManifest(files)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		key := plat.OS + "/" + plat.Architecture + "/" + plat.Variant
		if prev, dup := platforms[key]; dup {
			return "", fmt.Errorf("%s and %s are both %s", prev, p, strings.TrimSuffix(key, "/"))
		}
		platforms[key] = p
		names := make([]string, 0, len(files))
		for n := range files {
			if strings.HasPrefix(n, "blobs/sha256/") {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			data := files[n]
			b, err := writeBlob(tmp, func(w io.Writer) error { _, err := w.Write(data); return err })
			if err != nil {
				return "", err
			}
			if blobPath(b) != n {
				return "", fmt.Errorf("%s: %s does not hold its digest (%s)", p, n, b.digest)
			}
			blobs = append(blobs, b)
		}
		entries = append(entries, indexDescriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, Platform: &plat})
	}
	if len(entries) == 0 {
		return "", errors.New("no images to combine")
	}
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].Platform, entries[j].Platform
		return a.Architecture+a.Variant < b.Architecture+b.Variant
	})
	inner, err := jsonBlob(tmp, platformIndex{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: entries})
	if err != nil {
		return "", err
	}
	blobs = append(blobs, inner)
	top, err := json.Marshal(platformIndex{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: []indexDescriptor{{
		MediaType: mediaTypeIndex,
		Digest:    inner.digest,
		Size:      inner.size,
		Annotations: map[string]string{
			"io.containerd.image.name":          full,
			"org.opencontainers.image.ref.name": tag,
		},
	}}})
	if err != nil {
		return "", err
	}
	meta := []namedData{{"index.json", top}, {"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}}
	partial := out + ".partial"
	if err := writeOuter(partial, mtime, blobs, meta); err != nil {
		os.Remove(partial)
		return "", err
	}
	return inner.digest, os.Rename(partial, out)
}

// VerifyIndex checks a multi-platform archive of WriteIndex: each platform's
// manifest names a config of the same platform, and every ELF file in its
// layer is built for that platform's machine. It returns one line per
// platform.
func VerifyIndex(archive string) ([]string, error) {
	files, err := readArchive(archive)
	if err != nil {
		return nil, err
	}
	var top platformIndex
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaTypeIndex {
		return nil, fmt.Errorf("index.json: want one image index entry, have %+v", top.Manifests)
	}
	ib, err := blobOf(files, top.Manifests[0].Digest)
	if err != nil {
		return nil, err
	}
	var idx platformIndex
	if err := json.Unmarshal(ib, &idx); err != nil {
		return nil, fmt.Errorf("image index: %w", err)
	}
	var report []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			return nil, fmt.Errorf("manifest %s has no platform", d.Digest)
		}
		mb, err := blobOf(files, d.Digest)
		if err != nil {
			return nil, err
		}
		var m manifest
		if err := json.Unmarshal(mb, &m); err != nil {
			return nil, err
		}
		cb, err := blobOf(files, m.Config.Digest)
		if err != nil {
			return nil, err
		}
		var cfg imageConfig
		if err := json.Unmarshal(cb, &cfg); err != nil {
			return nil, err
		}
		p := *d.Platform
		if cfg.Architecture != p.Architecture || cfg.OS != p.OS || cfg.Variant != p.Variant {
			return nil, fmt.Errorf("manifest %s: platform %+v in the index, config says %s/%s/%s", d.Digest, p, cfg.OS, cfg.Architecture, cfg.Variant)
		}
		want, ok := elfMachine[p.Architecture]
		if !ok {
			return nil, fmt.Errorf("platform %+v: no ELF machine known", p)
		}
		elfs := 0
		for _, l := range m.Layers {
			lb, err := blobOf(files, l.Digest)
			if err != nil {
				return nil, err
			}
			tr := tar.NewReader(bytes.NewReader(lb))
			for {
				hdr, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return nil, err
				}
				if hdr.Typeflag != tar.TypeReg {
					continue
				}
				b, err := io.ReadAll(tr)
				if err != nil {
					return nil, err
				}
				ef, err := elf.NewFile(bytes.NewReader(b))
				if err != nil {
					continue
				}
				if ef.Machine != want {
					return nil, fmt.Errorf("%s/%s: /%s is %v, want %v", p.OS, p.Architecture, hdr.Name, ef.Machine, want)
				}
				elfs++
			}
		}
		if elfs == 0 {
			return nil, fmt.Errorf("%s/%s: no ELF files in the image", p.OS, p.Architecture)
		}
		report = append(report, fmt.Sprintf("%s/%s%s: %d ELF files, all %v", p.OS, p.Architecture, map[bool]string{true: "/" + p.Variant}[p.Variant != ""], elfs, want))
	}
	return report, nil
}
