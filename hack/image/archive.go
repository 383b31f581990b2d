// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Archive layouts.
const (
	FormatDocker = "docker"
	FormatOCI    = "oci"
)

// Media types written into OCI manifests and indexes.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// Spec is what the image's config says and how the archive is laid out.
type Spec struct {
	Name       string // NAME[:TAG]
	Format     string // FormatDocker or FormatOCI
	Arch       string // GOARCH spelling
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
	Time       time.Time // every mtime and the config's creation time
	Base       *Base     // the image the layer goes over; nil: none
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type runConfig struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// imageConfig is the OCI image configuration, which Docker reads as well.
type imageConfig struct {
	Created      string    `json:"created"`
	Architecture string    `json:"architecture"`
	Variant      string    `json:"variant,omitempty"`
	OS           string    `json:"os"`
	Config       runConfig `json:"config"`
	RootFS       rootFS    `json:"rootfs"`
	History      []history `json:"history"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// dockerManifest is one entry of a docker-archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

var (
	repoPart = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	hostPart = regexp.MustCompile(`^[a-zA-Z0-9.-]+(?::[0-9]+)?$`)
	tagRE    = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)
)

// parseRef splits NAME[:TAG] and returns the name as written (with its tag),
// the fully qualified name containerd stores (docker.io/library/... for a
// bare name) and the tag.
func parseRef(ref string) (familiar, full, tag string, err error) {
	name, tag := ref, "latest"
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		name, tag = ref[:i], ref[i+1:]
	}
	if strings.Contains(ref, "@") || !tagRE.MatchString(tag) || name == "" {
		return "", "", "", fmt.Errorf("image name %q: want NAME[:TAG]", ref)
	}
	parts := strings.Split(name, "/")
	first := parts[0]
	hasHost := len(parts) > 1 && (strings.ContainsAny(first, ".:") || first == "localhost")
	if hasHost && !hostPart.MatchString(first) {
		return "", "", "", fmt.Errorf("image name %q: bad registry host %q", ref, first)
	}
	repo := parts
	if hasHost {
		repo = parts[1:]
	}
	for _, p := range repo {
		if !repoPart.MatchString(p) {
			return "", "", "", fmt.Errorf("image name %q: bad path component %q (lower case letters, digits, separators)", ref, p)
		}
	}
	full = name
	switch {
	case hasHost:
	case len(parts) == 1:
		full = "docker.io/library/" + name
	default:
		full = "docker.io/" + name
	}
	return name + ":" + tag, full + ":" + tag, tag, nil
}

func variant(arch string) string {
	if arch == "arm64" {
		return "v8"
	}
	return ""
}

// Write packs layer into an archive at out, laid out as spec.Format says, and
// returns the digest of the image manifest (OCI) or of the config (docker),
// which is the image ID.
func Write(out string, spec Spec, layer *Layer) (string, error) {
	if spec.Format != FormatDocker && spec.Format != FormatOCI {
		return "", fmt.Errorf("format %q: want %s or %s", spec.Format, FormatDocker, FormatOCI)
	}
	familiar, full, tag, err := parseRef(spec.Name)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)

	layerBlob, err := writeBlob(tmp, func(w io.Writer) error { _, err := layer.WriteTo(w); return err })
	if err != nil {
		return "", fmt.Errorf("layer: %w", err)
	}
	created := spec.Time.UTC().Format(time.RFC3339)
	cfg := imageConfig{
		Created:      created,
		Architecture: spec.Arch,
		Variant:      variant(spec.Arch),
		OS:           "linux",
		Config: runConfig{
			User:       spec.User,
			Env:        spec.Env,
			Entrypoint: spec.Entrypoint,
			Cmd:        spec.Cmd,
			WorkingDir: spec.WorkingDir,
			Labels:     spec.Labels,
		},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{layerBlob.digest}},
		History: []history{{Created: created, CreatedBy: "pxn hack/image"}},
	}
	layerDescs := []descriptor{{MediaType: mediaTypeLayer, Digest: layerBlob.digest, Size: layerBlob.size}}
	var baseBlobs []blob
	if b := spec.Base; b != nil {
		if b.Config.Architecture != spec.Arch || b.Config.OS != "linux" {
			return "", fmt.Errorf("the base image is %s/%s, the layer is for linux/%s", b.Config.OS, b.Config.Architecture, spec.Arch)
		}
		for _, l := range b.Layers {
			data := b.blobs[l.Digest]
			lb, err := writeBlob(tmp, func(w io.Writer) error { _, err := w.Write(data); return err })
			if err != nil {
				return "", fmt.Errorf("base layer %s: %w", l.Digest, err)
			}
			baseBlobs = append(baseBlobs, lb)
		}
		cfg.Variant = b.Config.Variant
		cfg.Config = b.runConfig(spec)
		cfg.RootFS.DiffIDs = append(append([]string{}, b.Config.RootFS.DiffIDs...), layerBlob.digest)
		cfg.History = append(append([]history{}, b.Config.History...), cfg.History...)
		layerDescs = append(append([]descriptor{}, b.Layers...), layerDescs...)
	}
	configBlob, err := jsonBlob(tmp, cfg)
	if err != nil {
		return "", err
	}

	blobs := append(append([]blob{configBlob}, baseBlobs...), layerBlob)
	layerPaths := make([]string, 0, len(baseBlobs)+1)
	for _, b := range append(baseBlobs, layerBlob) {
		layerPaths = append(layerPaths, blobPath(b))
	}
	var meta []namedData
	var id string
	switch spec.Format {
	case FormatDocker:
		m, err := json.Marshal([]dockerManifest{{
			Config:   blobPath(configBlob),
			RepoTags: []string{familiar},
			Layers:   layerPaths,
		}})
		if err != nil {
			return "", err
		}
		meta = append(meta, namedData{"manifest.json", m})
		id = configBlob.digest
	case FormatOCI:
		manifestBlob, err := jsonBlob(tmp, manifest{
			SchemaVersion: 2,
			MediaType:     mediaTypeManifest,
			Config:        descriptor{MediaType: mediaTypeConfig, Digest: configBlob.digest, Size: configBlob.size},
			Layers:        layerDescs,
		})
		if err != nil {
			return "", err
		}
		blobs = append(blobs, manifestBlob)
		idx, err := json.Marshal(index{
			SchemaVersion: 2,
			MediaType:     mediaTypeIndex,
			Manifests: []descriptor{{
				MediaType: mediaTypeManifest,
				Digest:    manifestBlob.digest,
				Size:      manifestBlob.size,
				Annotations: map[string]string{
					"io.containerd.image.name":          full,
					"org.opencontainers.image.ref.name": tag,
				},
			}},
		})
		if err != nil {
			return "", err
		}
		meta = append(meta, namedData{"index.json", idx}, namedData{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)})
		id = manifestBlob.digest
	}

	partial := out + ".partial"
	if err := writeOuter(partial, spec.Time, blobs, meta); err != nil {
		os.Remove(partial)
		return "", err
	}
	return id, os.Rename(partial, out)
}

type namedData struct {
	name string
	data []byte
}

func blobPath(b blob) string { return "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:") }

func jsonBlob(dir string, v any) (blob, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return blob{}, err
	}
	return writeBlob(dir, func(w io.Writer) error { _, err := w.Write(data); return err })
}

// writeOuter writes the archive: the blobs folder, each blob (duplicates
// once), then the metadata files, all with fixed times and root ownership.
func writeOuter(out string, mtime time.Time, blobs []blob, meta []namedData) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	written := map[string]bool{}
	for _, b := range blobs {
		if written[b.digest] {
			continue
		}
		written[b.digest] = true
		if err := copyBlob(tw, b, mtime); err != nil {
			return err
		}
	}
	for _, m := range meta {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: m.name, Mode: 0o644, Size: int64(len(m.data)), ModTime: mtime}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(m.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func copyBlob(tw *tar.Writer, b blob, mtime time.Time) error {
	src, err := os.Open(b.path)
	if err != nil {
		return err
	}
	defer src.Close()
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: blobPath(b), Mode: 0o644, Size: b.size, ModTime: mtime}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.CopyN(tw, src, b.size)
	return err
}
