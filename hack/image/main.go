// SPDX-License-Identifier: Apache-2.0

// Command image packs files into a single-layer container image archive
// without a container engine: a docker-archive (the `docker save` layout) or
// an OCI image layout tarball, both accepted by `ctr -n k8s.io images import`.
// The archive is byte-for-byte reproducible: entries are sorted, owned by
// uid/gid 0 and stamped with one fixed time.
//
//	go run ./hack/image -o pxn.tar -name pxn:0.1.0 -ldd \
//	    -add bin/pxn-agent:/usr/local/bin/pxn-agent \
//	    -add bin/pxn-device-plugin:/usr/local/bin/pxn-device-plugin \
//	    -entrypoint /usr/local/bin/pxn-agent
//	go run ./hack/image -o pause.tar -name pause:3.10 -pause
//	go run ./hack/image -index -o pxn.oci.tar -name pxn:0.1.0 pxn-amd64.tar pxn-arm64.tar
//	go run ./hack/image -verify pxn.oci.tar
//
// See docs/images.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// pausePackage is built with CGO_ENABLED=0 in -pause mode.
const pausePackage = "github.com/pxn-project/pxn/hack/image/pause"

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var (
		out, name, format, user, workdir, arch string
		adds, entrypoint, cmd, env, labels     listFlag
		sysroot, base                          string
		ldd, pause, etc, mkIndex, verify       bool
		epoch                                  int64
	)
	fs.StringVar(&out, "o", "", "archive to write (required)")
	fs.StringVar(&name, "name", "", "image reference, NAME[:TAG] (required); a missing tag is latest")
	fs.StringVar(&format, "format", FormatDocker, "archive layout: docker (docker save) or oci (OCI image layout)")
	fs.Var(&adds, "add", "SRC:DST[:MODE] file to put at absolute path DST, MODE in octal (default: SRC's permissions); repeatable")
	fs.BoolVar(&ldd, "ldd", false, "also add the shared libraries and the loader that each added dynamic ELF file needs, as ldd resolves them on this machine")
	fs.BoolVar(&etc, "etc", true, "add a minimal /etc/passwd, /etc/group and /etc/nsswitch.conf (root and nonroot 65532) and /tmp")
	fs.StringVar(&sysroot, "sysroot", "", "with -ldd, for a foreign architecture: take the libraries from DIR/lib (e.g. /usr/aarch64-linux-gnu) by the files' DT_NEEDED entries instead of ldd")
	fs.StringVar(&base, "base", "", "a one-image OCI archive the layer goes over: the image keeps its layers and configuration, -env, -entrypoint, -cmd, -user, -workdir and -label given on top; -etc defaults to false")
	fs.BoolVar(&mkIndex, "index", false, "combine the one-platform OCI archives given as arguments into one multi-platform image -name at -o")
	fs.BoolVar(&verify, "verify", false, "check the multi-platform archive given as the argument: platforms agree with the configs, every ELF file matches its platform")
	fs.BoolVar(&pause, "pause", false, "build "+pausePackage+" with CGO_ENABLED=0 and make a pause image of it (/pause); run inside the module")
	fs.Var(&entrypoint, "entrypoint", "entrypoint argument; repeat for each element")
	fs.Var(&cmd, "cmd", "cmd argument; repeat for each element")
	fs.Var(&env, "env", "KEY=VALUE in the image's environment; repeatable")
	fs.Var(&labels, "label", "KEY=VALUE image label; repeatable")
	fs.StringVar(&user, "user", "", "user the image runs as, e.g. 65532:65532 (default: root)")
	fs.StringVar(&workdir, "workdir", "/", "working directory")
	fs.StringVar(&arch, "arch", runtime.GOARCH, "image architecture (GOARCH spelling)")
	fs.Int64Var(&epoch, "epoch", sourceDateEpoch(), "modification time of every entry and the image's creation time, in Unix seconds (default: $SOURCE_DATE_EPOCH or 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if verify {
		if fs.NArg() != 1 {
			return errors.New("-verify takes one archive")
		}
		report, err := VerifyIndex(fs.Arg(0))
		if err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(0), err)
		}
		for _, l := range report {
			fmt.Printf("%s: %s\n", fs.Arg(0), l)
		}
		return nil
	}
	if mkIndex {
		if out == "" || name == "" || fs.NArg() == 0 {
			return errors.New("-index needs -o, -name and the one-platform archives")
		}
		digest, err := WriteIndex(out, name, fs.Args(), time.Unix(epoch, 0).UTC())
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s %s (%d platforms)\n", out, name, digest, fs.NArg())
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if out == "" || name == "" {
		return errors.New("-o and -name are required")
	}

	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if base != "" {
		if !given["etc"] {
			etc = false
		}
		if !given["workdir"] {
			workdir = ""
		}
	}

	spec := Spec{
		Name:       name,
		Format:     format,
		Arch:       arch,
		Entrypoint: entrypoint,
		Cmd:        cmd,
		User:       user,
		WorkingDir: workdir,
		Time:       time.Unix(epoch, 0).UTC(),
	}
	for _, kv := range env {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("-env %q: want KEY=VALUE", kv)
		}
		spec.Env = append(spec.Env, kv)
	}
	if len(labels) > 0 {
		spec.Labels = map[string]string{}
		for _, kv := range labels {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("-label %q: want KEY=VALUE", kv)
			}
			spec.Labels[k] = v
		}
	}

	var files []File
	if pause {
		dir, err := os.MkdirTemp("", "pause-build-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "pause")
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pausePackage)
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build %s: %w", pausePackage, err)
		}
		files = append(files, File{Src: bin, Dst: "/pause", Mode: 0o755})
		if len(spec.Entrypoint) == 0 {
			spec.Entrypoint = []string{"/pause"}
		}
		etc = false
	}
	for _, a := range adds {
		f, err := parseAdd(a)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return errors.New("nothing to pack: give -add or -pause")
	}
	if ldd && sysroot != "" {
		libs, err := sysrootLibraries(files, sysroot, arch)
		if err != nil {
			return err
		}
		files = append(files, libs...)
	} else if ldd {
		libs, err := sharedLibraries(files)
		if err != nil {
			return err
		}
		files = append(files, libs...)
	}
	if pause {
		if err := requireStatic(files[0].Src); err != nil {
			return err
		}
	}

	if base != "" {
		b, err := ReadBase(base)
		if err != nil {
			return err
		}
		spec.Base = b
	}

	layer, err := NewLayer(spec.Time)
	if err != nil {
		return err
	}
	if etc {
		layer.AddBase()
	}
	for _, f := range files {
		if err := layer.AddFile(f); err != nil {
			return err
		}
	}
	digest, err := Write(out, spec, layer)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s %s\n", out, spec.Name, digest)
	return nil
}

// parseAdd reads SRC:DST[:MODE].
func parseAdd(s string) (File, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
		return File{}, fmt.Errorf("-add %q: want SRC:DST[:MODE] with an absolute DST", s)
	}
	f := File{Src: parts[0], Dst: parts[1]}
	if len(parts) == 3 {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil || m > 0o7777 {
			return File{}, fmt.Errorf("-add %q: mode %q is not an octal permission", s, parts[2])
		}
		f.Mode = int64(m)
	}
	return f, nil
}

func sourceDateEpoch() int64 {
	if v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return v
	}
	return 0
}
