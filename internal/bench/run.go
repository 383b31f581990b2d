// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/pkg/cuda"
)

// device is the parent's view of where the ranks' sources and the
// targets' buffers live and what carries the second hop.
type device struct {
	kind string
	// hop names the second hop in the rows.
	hop string
	// spin makes the ranks poll for completion without sleeping.
	spin bool
	// registry is the folder the registry folder is made in.
	registry string
	// ngpu is the number of CUDA devices.
	ngpu int
	// startup bounds a child's start.
	startup time.Duration
	// mps is whether the CUDA processes share their GPUs through MPS.
	mps mpsState
	// pidns starts each rank in namespaces of its own.
	pidns bool
	// progress takes a line as each step of a phase starts (nil: none).
	progress io.Writer
	// procs are the run's children, ended together when the run is
	// interrupted.
	procs *procSet
}

// say writes one progress line.
func (dev *device) say(format string, args ...any) {
	if dev.progress != nil {
		fmt.Fprintf(dev.progress, "pxn-bench: "+format+"\n", args...)
	}
}

// Run runs one traffic pattern, or with CUDA.Suite the CUDA performance
// suites, each rank and target a process of this binary (its rank and
// target commands). It prints each scenario's rows to o.Out as soon as the
// scenario ends (and rewrites o.JSON), and returns every row. When ctx ends
// (a signal), Run kills its ranks and targets, removes their registry and
// work folders, and returns the rows so far with an error.
func Run(ctx context.Context, o RunOptions) (rows []Row, err error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	dev, err := openDevice(o)
	if err != nil {
		return nil, err
	}
	dev.procs = newProcSet()
	stop := context.AfterFunc(ctx, func() { dev.procs.stop(fmt.Errorf("interrupted: %w", context.Cause(ctx))) })
	defer func() {
		stop()
		if cause := dev.procs.stopped(); cause != nil {
			err = cause
		}
	}()
	dev.progress = o.ErrOut
	if dev.pidns = o.PIDNS; o.PIDNS {
		fmt.Fprintln(o.Out, "pxn-bench: each rank runs in a PID and mount namespace of its own, with its own /proc")
	}
	var runs []scenario
	if o.CUDA.Suite == "" {
		s := scenario{pattern: o.Pattern, ranks: o.Ranks, bytes: o.Bytes, block: o.Block, rate: o.CUDA.Rate,
			raw: o.CUDA.Raw, bare: true, idle: true, again: o.AllocPass, latency: o.CUDA.Latency, hold: o.HoldAfter}
		if o.Pattern == "kv" {
			s.kv, s.idle = &o.KV, false
		}
		if dev.kind == "cuda" {
			s.warm, s.p6 = true, true
			if s.gpus, err = rankGPUs(o.CUDA.GPUs, o.Ranks, dev.ngpu); err != nil {
				return nil, err
			}
		}
		runs = append(runs, s)
	}
	var want map[string]bool
	if o.CUDA.Suite != "" {
		if dev.kind != "cuda" {
			return nil, fmt.Errorf("--suite %q: the performance suites run on --device cuda", o.CUDA.Suite)
		}
		if want, err = parseSuite(o.CUDA.Suite); err != nil {
			return nil, err
		}
		runs = suiteRuns(want, dev.ngpu)
	}
	if dev.kind == "cuda" {
		if w := mpsWarning(dev.mps, runs); w != "" {
			fmt.Fprintln(o.ErrOut, w)
		}
	}
	// Each scenario's rows are printed, and the JSON file rewritten, as
	// soon as the scenario ends: a run cut short by a time limit keeps
	// what it measured.
	emitRows := func(rs []Row) error {
		for i := range rs {
			rs[i].Settings = o.rankSettings()
			if dev.kind == "cuda" {
				rs[i].MPS = dev.mps.String()
			}
		}
		rows = append(rows, rs...)
		printRows(o.Out, rs)
		if o.JSON != "" {
			return writeJSON(o.JSON, rows)
		}
		return nil
	}
	for _, s := range runs {
		t0 := time.Now()
		rs, err := dev.exec(o, s)
		if o.CUDA.Suite != "" {
			// A suite's step has a time limit: each scenario's time says
			// which one to shorten when a step runs out.
			fmt.Fprintf(o.ErrOut, "pxn-bench: %s took %.1f s\n", dev.title(s), time.Since(t0).Seconds())
		}
		if err != nil {
			if s.id != "" {
				err = fmt.Errorf("%s: %w", s.id, err)
			}
			return rows, err
		}
		if err := emitRows(rs); err != nil {
			return rows, err
		}
	}
	if want["p2"] {
		rs, err := dev.firsthop(o)
		if err != nil {
			return rows, fmt.Errorf("P2: %w", err)
		}
		if err := emitRows(rs); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// openDevice checks that the device can run and prints what stands in for
// what.
func openDevice(o RunOptions) (*device, error) {
	switch o.Device {
	case "host":
		fmt.Fprintf(o.Out, "pxn-bench: host-memory path: %d ranks as processes, host memory stands in for GPU memory, a TCP hop on loopback stands in for RDMA\n", o.Ranks)
		root := o.RegistryRoot
		if root == "" {
			root = "/dev/shm"
			if st, err := os.Stat(root); err != nil || !st.IsDir() {
				root = os.TempDir()
			}
		}
		return &device{kind: "host", hop: "hop", registry: root, startup: time.Minute}, nil
	case "cuda":
	default:
		return nil, fmt.Errorf("--device %q: want host or cuda", o.Device)
	}
	d, err := cuda.Load()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w; this machine cannot run the CUDA path (--device host runs without a GPU)", err)
	}
	defer d.Close()
	n, err := d.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("--device cuda: the driver reports no CUDA device")
	}
	var names []string
	for i := 0; i < n; i++ {
		dev, err := d.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		name, _ := d.DeviceName(dev)
		names = append(names, name)
	}
	drv := d.Version()
	fmt.Fprintf(o.Out, "pxn-bench: CUDA path: %d GPUs (%s), driver CUDA %d.%d; ranks and targets are processes, rails are simulated, the second hop is an emulated NIC (writes into the target processes' device buffers, one GPU operation per batch of ops, completions paced by a wire of --rate GB/s)\n",
		n, strings.Join(names, ", "), drv/1000, drv%1000/10)
	mps := detectMPS(o.Getenv)
	fmt.Fprintf(o.Out, "pxn-bench: MPS %s: %s\n", mps, mps.why)
	root := o.RegistryRoot
	if root == "" {
		root = "/dev/shm"
	}
	return &device{kind: "cuda", hop: "emulated NIC", spin: true, registry: root, ngpu: n, startup: 3 * time.Minute, mps: mps}, nil
}

// firsthop runs P2 in a child process (the parent keeps no CUDA context).
func (dev *device) firsthop(o RunOptions) ([]Row, error) {
	sender := min(1, dev.ngpu-1)
	args := []string{"cuda-firsthop", "--relay-gpu", "0", "--sender-gpu", strconv.Itoa(sender)}
	if o.CUDA.GatherPTX != "" {
		args = append(args, "--gather-ptx", o.CUDA.GatherPTX)
	}
	c, err := startChild("first-hop ring", nil, args...)
	if err != nil {
		return nil, err
	}
	if err := dev.procs.add(c); err != nil {
		return nil, err
	}
	defer c.kill()
	ev, err := c.expect("rows", 20*time.Minute)
	if err != nil {
		return nil, err
	}
	return slices.Clone(ev.Rows), nil
}
