// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// File is one file to put into the layer.
type File struct {
	Src string // file on this machine; symlinks are followed
	Dst string // absolute path in the image
	// Mode is the permission in tar's octal form (0o755, 0o4755); zero takes
	// Src's permission bits.
	Mode int64
}

type entry struct {
	typ      byte // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	mode     int64
	src      string // TypeReg read from a file
	data     []byte // TypeReg held in memory
	linkname string
}

// Layer is the image's one filesystem layer, built in memory from paths to
// entries and serialized in path order.
type Layer struct {
	mtime   time.Time
	entries map[string]*entry
}

// NewLayer returns an empty layer whose entries all carry mtime.
func NewLayer(mtime time.Time) (*Layer, error) {
	return &Layer{mtime: mtime, entries: map[string]*entry{}}, nil
}

// clean turns an absolute image path into a tar name without the leading
// slash, refusing paths that leave the root.
func clean(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("image path %q is not absolute", p)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", fmt.Errorf("image path %q names the root", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}

func (l *Layer) addParents(name string) error {
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		if e, ok := l.entries[dir]; ok {
			if e.typ != tar.TypeDir {
				return fmt.Errorf("/%s is a file and a parent of /%s", dir, name)
			}
			continue
		}
		l.entries[dir] = &entry{typ: tar.TypeDir, mode: 0o755}
	}
	return nil
}

func (l *Layer) put(p string, e *entry) error {
	name, err := clean(p)
	if err != nil {
		return err
	}
	if old, ok := l.entries[name]; ok {
		if old.typ == tar.TypeDir && e.typ == tar.TypeDir {
			old.mode = e.mode
			return nil
		}
		if old.typ == tar.TypeReg && e.typ == tar.TypeReg && old.src != "" && old.src == e.src {
			return nil
		}
		return fmt.Errorf("/%s added twice", name)
	}
	if err := l.addParents(name); err != nil {
		return err
	}
	l.entries[name] = e
	return nil
}

// AddFile adds a regular file read from f.Src when the layer is written.
func (l *Layer) AddFile(f File) error {
	fi, err := os.Stat(f.Src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", f.Src)
	}
	mode := f.Mode
	if mode == 0 {
		mode = int64(fi.Mode().Perm())
	}
	return l.put(f.Dst, &entry{typ: tar.TypeReg, mode: mode, src: f.Src})
}

// AddData adds a regular file with the given content.
func (l *Layer) AddData(p string, data []byte, mode int64) error {
	return l.put(p, &entry{typ: tar.TypeReg, mode: mode, data: data})
}

// AddDir adds a directory.
func (l *Layer) AddDir(p string, mode int64) error {
	return l.put(p, &entry{typ: tar.TypeDir, mode: mode})
}

// AddSymlink adds a symbolic link.
func (l *Layer) AddSymlink(p, target string) error {
	return l.put(p, &entry{typ: tar.TypeSymlink, mode: 0o777, linkname: target})
}

// AddBase adds what a program built against glibc expects beyond its
// libraries: user and group databases naming root and nonroot (65532), an
// nsswitch.conf that reads only files, and a sticky /tmp.
func (l *Layer) AddBase() {
	// The paths are constant and distinct, so put cannot fail.
	_ = l.AddData("/etc/passwd", []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644)
	_ = l.AddData("/etc/group", []byte("root:x:0:\nnonroot:x:65532:\n"), 0o644)
	_ = l.AddData("/etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644)
	_ = l.AddDir("/tmp", 0o1777)
	_ = l.AddDir("/root", 0o700)
	_ = l.AddDir("/home/nonroot", 0o700)
}

// WriteTo writes the layer as an uncompressed tar in path order.
func (l *Layer) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	names := make([]string, 0, len(l.entries))
	for n := range l.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := l.entries[n]
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     n,
			Mode:     e.mode,
			ModTime:  l.mtime,
			Linkname: e.linkname,
		}
		if e.typ == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := writeEntry(tw, hdr, e); err != nil {
			return cw.n, fmt.Errorf("/%s: %w", n, err)
		}
	}
	err := tw.Close()
	return cw.n, err
}

func writeEntry(tw *tar.Writer, hdr *tar.Header, e *entry) error {
	if e.typ != tar.TypeReg {
		return tw.WriteHeader(hdr)
	}
	if e.src == "" {
		hdr.Size = int64(len(e.data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// blob is content stored once in a temporary file, named by its digest.
type blob struct {
	path   string
	digest string // sha256:<hex>
	size   int64
}

func writeBlob(dir string, fill func(io.Writer) error) (blob, error) {
	f, err := os.CreateTemp(dir, "blob-")
	if err != nil {
		return blob{}, err
	}
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	if err := fill(cw); err != nil {
		f.Close()
		return blob{}, err
	}
	if err := f.Close(); err != nil {
		return blob{}, err
	}
	return blob{path: f.Name(), digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: cw.n}, nil
}

// lddLine matches "name => /path (0x...)" and "/path (0x...)".
var lddLine = regexp.MustCompile(`^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$`)

// sharedLibraries returns the libraries, and the loader, that the dynamic ELF
// files among files (executables and shared objects) need, at the paths ldd
// resolves them to on this machine. Libraries loaded with dlopen (libcuda,
// libnvidia-ml) are not listed by ldd and stay out: the NVIDIA container
// runtime provides them.
func sharedLibraries(files []File) ([]File, error) {
	seen := map[string]bool{}
	var libs []File
	for _, f := range files {
		dynamic, err := isDynamicELF(f.Src)
		if err != nil {
			return nil, err
		}
		if !dynamic {
			continue
		}
		out, err := exec.Command("ldd", f.Src).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", f.Src, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "not found") {
				return nil, fmt.Errorf("ldd %s: %s", f.Src, strings.TrimSpace(line))
			}
			m := lddLine.FindStringSubmatch(line)
			if m == nil || seen[m[2]] {
				continue
			}
			seen[m[2]] = true
			real, err := filepath.EvalSymlinks(m[2])
			if err != nil {
				return nil, fmt.Errorf("ldd %s: %w", f.Src, err)
			}
			libs = append(libs, File{Src: real, Dst: m[2], Mode: 0o755})
		}
	}
	sort.Slice(libs, func(i, j int) bool { return libs[i].Dst < libs[j].Dst })
	return libs, nil
}

// isDynamicELF reports whether p is an ELF file that needs shared libraries:
// it names a program interpreter or lists DT_NEEDED entries. Files that are
// not ELF (scripts, data) are not dynamic.
func isDynamicELF(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return false, nil
		}
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return true, nil
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	return len(needed) > 0, nil
}

func requireStatic(p string) error {
	dynamic, err := isDynamicELF(p)
	if err != nil {
		return err
	}
	if dynamic {
		return fmt.Errorf("%s is dynamically linked; the pause image needs a static binary", p)
	}
	return nil
}
