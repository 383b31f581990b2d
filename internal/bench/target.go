// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
)

// targetDevice is a remote node's registered buffer on one rail.
type targetDevice interface {
	// received returns the buffer's bytes in host memory.
	received() ([]byte, error)
	// reset zeroes the buffer for the next phase.
	reset() error
	close() error
}

// TargetOptions are a target process's flags, set by the parent: its
// device, its rail, its GPU on the CUDA path and the layout file.
type TargetOptions struct {
	Device string
	Index  int
	GPU    int
	Layout string
}

// TargetMain is one remote target of a run; it returns the command's exit
// status.
func TargetMain(o TargetOptions) int {
	if err := runTarget(o.Device, o.Index, o.GPU, o.Layout); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

// runTarget is a target process: it reports where the ranks' hops reach
// its buffer ("listening": a TCP address on the host path, an IPC handle on
// GPUs) and checks, when asked, that every byte the layout sends it is
// right.
func runTarget(device string, k, ordinal int, layoutPath string) (err error) {
	l, err := readLayout(layoutPath)
	if err != nil {
		return err
	}
	if k < 0 || k >= len(l.TargetBytes) {
		return fmt.Errorf("--index %d: the layout has %d targets", k, len(l.TargetBytes))
	}
	var t targetDevice
	var addr string
	switch device {
	case "host":
		t, addr, err = newHostTarget(l.TargetBytes[k])
	case "cuda":
		t, addr, err = newCUDATarget(ordinal, l.TargetBytes[k])
	default:
		err = fmt.Errorf("--device %q: want host or cuda", device)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, t.close()) }()
	emit(event{Event: "listening", Addr: addr})
	for cmd := range commands() {
		switch cmd {
		case "verify":
			buf, err := t.received()
			if err == nil {
				err = verifyTarget(l, k, buf)
			}
			ev := event{Event: "verified", OK: err == nil}
			if err != nil {
				ev.Error = err.Error()
			}
			emit(ev)
		case "reset":
			if err := t.reset(); err != nil {
				return err
			}
			emit(event{Event: "reset"})
		case "exit":
			return nil
		}
	}
	return nil
}

// verifyTarget checks every transfer into target k, on every CPU.
func verifyTarget(l *layout, k int, buf []byte) error {
	if l.KV != nil {
		return verifyKV(l, k, buf)
	}
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
