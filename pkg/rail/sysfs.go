// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// sysfs reads a host's sysfs through an fs.FS rooted at the host root. Paths
// are slash-separated and relative to that root ("sys/class/infiniband").
// One sysfs lives for one Discover call; it caches what each path is.
type sysfs struct {
	fsys     fs.FS
	dir      string // the host root on disk when fsys is os.DirFS(dir), for raw reads
	root     string
	log      klog.Logger
	warnings *[]string
	nodes    map[string]node
}

// node is what Lstat said about a path.
type node struct {
	link   string // target when the path is a symlink
	isLink bool
	err    error
}

// newSysfs reads fsys; dir, when not empty, is the folder fsys is
// os.DirFS of, and attribute files are then read with plain syscalls.
func newSysfs(fsys fs.FS, dir, root string, log klog.Logger, warnings *[]string) *sysfs {
	return &sysfs{fsys: fsys, dir: dir, root: root, log: log, warnings: warnings, nodes: map[string]node{}}
}

// host names a path as the host sees it: /sys/... under the host root.
func (s *sysfs) host(rel string) string {
	return filepath.Join(s.root, filepath.FromSlash(rel))
}

// warn records an odd sysfs entry at rel.
func (s *sysfs) warn(rel, format string, args ...any) {
	s.warnFile(s.host(rel), format, args...)
}

// warnFile records a problem with the file at p (a host path).
func (s *sysfs) warnFile(p, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	*s.warnings = append(*s.warnings, p+": "+msg)
	s.log.Info("Rail discovery skipped or marked an entry", "path", p, "problem", msg)
}

// errText is err without the path an fs.PathError repeats.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func (s *sysfs) lstat(p string) node {
	if n, ok := s.nodes[p]; ok {
		return n
	}
	var n node
	fi, err := fs.Lstat(s.fsys, p)
	switch {
	case err != nil:
		n.err = err
	case fi.Mode()&fs.ModeSymlink != 0:
		n.isLink = true
		n.link, n.err = fs.ReadLink(s.fsys, p)
	}
	s.nodes[p] = n
	return n
}

// exists reports whether p is there, without following a final symlink.
func (s *sysfs) exists(p string) bool { return s.lstat(p).err == nil }

// resolve follows every symlink in p, confined to the host root: an absolute
// target starts again at the root and ".." never climbs above it, as for a
// process chrooted there. The result is the physical path, e.g.
// sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0.
func (s *sysfs) resolve(p string) (string, error) {
	resolved, todo, links := "", p, 0
	for todo != "" {
		var comp string
		comp, todo, _ = strings.Cut(todo, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			resolved = parentOf(resolved)
			continue
		}
		next := comp
		if resolved != "" {
			next = resolved + "/" + comp
		}
		n := s.lstat(next)
		if n.err != nil {
			return "", fmt.Errorf("%s: %s", s.host(next), errText(n.err))
		}
		if !n.isLink {
			resolved = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", s.host(p))
		}
		if strings.HasPrefix(n.link, "/") {
			resolved = ""
		}
		if todo != "" {
			todo = n.link + "/" + todo
		} else {
			todo = n.link
		}
	}
	if resolved == "" {
		return ".", nil
	}
	return resolved, nil
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// read returns the trimmed contents of the attribute file p.
func (s *sysfs) read(p string) (string, error) {
	if s.dir != "" {
		return readAttrFile(s.dir, p)
	}
	b, err := fs.ReadFile(s.fsys, p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readAttrFile reads dir/p with open, read and close alone: an os.File costs
// several more syscalls (fcntl, fstat, epoll registration), and discovery
// reads hundreds of attributes. A sysfs attribute arrives whole in one read
// of up to a page, so a short read ends the file.
func readAttrFile(dir, p string) (string, error) {
	fd, err := syscall.Open(dir+"/"+p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer syscall.Close(fd)
	var page [4096]byte
	var out []byte
	for len(out) < 64<<10 {
		n, err := syscall.Read(fd, page[:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "read", Path: p, Err: err}
		}
		out = append(out, page[:n]...)
		if n < len(page) {
			break
		}
	}
	return strings.TrimSpace(string(out)), nil
}

// attr reads an attribute that must be there and not be empty; otherwise it
// warns and reports false.
func (s *sysfs) attr(p string) (string, bool) {
	v, err := s.read(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.warn(p, "missing")
		return "", false
	case err != nil:
		s.warn(p, "unreadable: %s", errText(err))
		return "", false
	case v == "":
		s.warn(p, "empty")
		return "", false
	}
	return v, true
}

// hexAttr reads a 0x-prefixed hex attribute (vendor, class).
func (s *sysfs) hexAttr(p string) (uint32, bool) {
	v, ok := s.attr(p)
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutPrefix(v, "0x")
	n, err := strconv.ParseUint(digits, 16, 32)
	if !ok || err != nil || digits == "" {
		s.warn(p, "%q is not a hex number", v)
		return 0, false
	}
	return uint32(n), true
}

// numaNode reads a device's numa_node; -1 (no NUMA affinity) when missing or
// garbled, with a warning.
func (s *sysfs) numaNode(dev string) int {
	p := dev + "/numa_node"
	v, ok := s.attr(p)
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < -1 || n > 4095 {
		s.warn(p, "%q is not a NUMA node", v)
		return -1
	}
	return n
}

// isVF reports whether the PCI function at dev is an SR-IOV virtual function.
func (s *sysfs) isVF(dev string) bool { return s.exists(dev + "/physfn") }

// pciPath splits a resolved PCI device folder into the host bridge and the
// chain of PCI functions down to the device:
// [pci0000:15 0000:15:01.0 0000:16:00.0 0000:17:00.0 0000:18:00.0].
func pciPath(dir string) ([]string, error) {
	rest, ok := strings.CutPrefix(dir, "sys/devices/")
	if !ok {
		return nil, fmt.Errorf("/%s is not under /sys/devices", dir)
	}
	comps := strings.Split(rest, "/")
	if !strings.HasPrefix(comps[0], "pci") {
		return nil, fmt.Errorf("/%s is not below a PCI host bridge", dir)
	}
	if len(comps) < 2 {
		return nil, fmt.Errorf("/%s is a host bridge, not a PCI function", dir)
	}
	for i, c := range comps[1:] {
		if isBusID(c) || (i < len(comps)-2 && strings.HasPrefix(c, "pci")) {
			continue
		}
		return nil, fmt.Errorf("/%s: %q is not a PCI address", dir, c)
	}
	return comps, nil
}

// readDirNames lists a folder's names; a missing folder is empty.
func (s *sysfs) readDirNames(p string) ([]string, error) {
	entries, err := fs.ReadDir(s.fsys, p)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}
