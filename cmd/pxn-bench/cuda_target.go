package main

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"runtime"

	"github.com/pxn-project/pxn/internal/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
)

// cudaTargetMain is a remote node's registered buffer on one rail, in
// device memory: it exports the buffer's IPC handle for the ranks' emulated
// NICs and checks, when asked, every byte the layout sends it (copied back
// to the host).
func cudaTargetMain(args []string) int {
	fs := flag.NewFlagSet("cuda-target", flag.ContinueOnError)
	index := fs.Int("index", 0, "rail of this target")
	ordinal := fs.Int("gpu", 0, "GPU ordinal")
	layoutPath := fs.String("layout", "", "layout file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runCUDATarget(*index, *ordinal, *layoutPath); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

func runCUDATarget(k, ordinal int, layoutPath string) (err error) {
	runtime.LockOSThread()
	l, err := readLayout(layoutPath)
	if err != nil {
		return err
	}
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	g, err := gpu.Open(d, ordinal)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		return err
	}
	want := l.TargetBytes[k]
	n := (max(want, 1<<20) + 4095) &^ 4095
	buf, err := d.MemAlloc(n)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.MemFree(buf)) }()
	clearDevice := func() error {
		if err := d.MemsetD32Async(buf, 0, n/4, 0); err != nil {
			return err
		}
		return d.StreamSynchronize(0)
	}
	if err := clearDevice(); err != nil {
		return err
	}
	h, err := d.IPCGetMemHandle(buf)
	if err != nil {
		return err
	}
	emit(event{Event: "listening", Addr: hex.EncodeToString(h[:])})
	var host []byte
	for cmd := range commands() {
		switch cmd {
		case "verify":
			if host == nil {
				host = make([]byte, want)
			}
			err := d.MemcpyDtoH(host, buf)
			if err == nil {
				err = verifyTargetParallel(l, k, host)
			}
			ev := event{Event: "verified", OK: err == nil}
			if err != nil {
				ev.Error = err.Error()
			}
			emit(ev)
		case "reset":
			if err := clearDevice(); err != nil {
				return err
			}
			emit(event{Event: "reset"})
		case "exit":
			return nil
		}
	}
	return nil
}

// verifyTargetParallel is verifyTarget on every CPU.
func verifyTargetParallel(l *layout, k int, buf []byte) error {
	for _, t := range l.ofTarget(k) {
		err := parallel(t.Len, 64<<20, func(a, e uint64) error {
			return checkPattern(buf[t.Dst+a:t.Dst+e], t.Seed, t.Src+a)
		})
		if err != nil {
			return fmt.Errorf("target %s, data from rank %d: %w", sessionName(k), t.Rank, err)
		}
	}
	return nil
}
