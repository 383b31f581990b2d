// SPDX-License-Identifier: Apache-2.0

// Command pxn-gpucheck reports what PXN's CUDA first hop finds on a GPU
// machine and measures it.
//
//	pxn-gpucheck info                 driver, devices, entry points
//	pxn-gpucheck ring [flags]         raw copy-engine rate vs the copier's ring
//	pxn-gpucheck version              the version (also --version)
//
// ring re-executes itself as the relay process of each run.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/sim/ringcheck"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
)

func main() {
	if ringcheck.IsRelay() {
		if err := ringcheck.RelayMain(); err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(cli.Execute(newRootCommand(os.Stdout, os.Stderr), os.Args[1:], os.Stderr))
}

// ringConfig is what the ring flags say.
type ringConfig struct {
	pieces, warm int
	shm          string
	timeout      time.Duration
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "pxn-gpucheck",
		Short: "Report and measure PXN's CUDA first hop on a GPU machine",
		Long: `pxn-gpucheck reports what PXN's CUDA first hop finds on a GPU machine (driver,
devices, entry points) and measures the copier's ring against raw copies.`,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(&cobra.Command{
		Use:   "info",
		Short: "Print the driver, the devices and the entry points the first hop uses",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := info(); err != nil {
				return cli.Failed(err)
			}
			return nil
		},
	})
	var rc ringConfig
	ringCmd := &cobra.Command{
		Use:   "ring",
		Short: "Measure the copy engine's raw rate against the copier's ring",
		Long: `Measures the copy engine's raw rate against the copier's ring, on one GPU and
between two. It re-executes itself as the relay process of each run.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := ring(rc); err != nil {
				return cli.Failed(err)
			}
			return nil
		},
	}
	fs := ringCmd.Flags()
	fs.IntVar(&rc.pieces, "pieces", 2048, "measured Pieces per run")
	fs.IntVar(&rc.warm, "warmup", 64, "Pieces before measuring")
	fs.StringVar(&rc.shm, "shm", "/dev/shm", "tmpfs folder for the ring's lane words")
	fs.DurationVar(&rc.timeout, "timeout", 60*time.Second, "per run")
	root.AddCommand(ringCmd)
	cli.Setup(root, "PXN_GPUCHECK", nil)
	return root
}

func info() error {
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	defer d.Close()
	n, err := d.DeviceCount()
	if err != nil {
		return err
	}
	fmt.Printf("driver %d (cuGetProcAddress_v2: %v), %d devices, copy mode %v\n", d.Version(), d.ProcAddressV2(), n, d.BestCopyMode())
	for i := 0; i < n; i++ {
		dev, err := d.DeviceGet(i)
		if err != nil {
			return err
		}
		name, _ := d.DeviceName(dev)
		bus, _ := d.DevicePCIBusID(dev)
		sms, _ := d.DeviceAttribute(cuda.AttrMultiprocessorCount, dev)
		memops, _ := d.DeviceAttribute(cuda.AttrCanUseStreamMemOpsV1, dev)
		fmt.Printf("device %d: %s at %s, %d SMs, CAN_USE_STREAM_MEM_OPS_V1=%d", i, name, bus, sms, memops)
		for j := 0; j < n; j++ {
			if j != i {
				peer, _ := d.DeviceGet(j)
				can, _ := d.DeviceCanAccessPeer(dev, peer)
				fmt.Printf(", peer %d: %v", j, can)
			}
		}
		fmt.Println()
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "entry point\tversion\tloaded")
	for _, s := range d.Symbols() {
		fmt.Fprintf(tw, "%s\t%d\t%v\n", s.Name, s.Version, s.Loaded)
	}
	return tw.Flush()
}

type row struct {
	scenario string
	bytes    uint64
	pieces   int
	ring     time.Duration
	raw      time.Duration
	note     string
}

func gbps(b uint64, d time.Duration) float64 { return float64(b) / d.Seconds() / 1e9 }

func ring(rc ringConfig) error {
	pieces, warm, shm, timeout := &rc.pieces, &rc.warm, &rc.shm, &rc.timeout
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	defer d.Close()
	n, err := d.DeviceCount()
	if err != nil {
		return err
	}
	relayDev := 0
	if n > 1 {
		relayDev = 1
	}
	type scenario struct {
		name     string
		relayDev int
		entries  int
		opts     gpu.CopierOptions
	}
	var runs []scenario
	for _, rd := range []int{relayDev, 0} {
		where := "same GPU"
		if rd != 0 {
			where = "GPU0→GPU1"
		}
		runs = append(runs,
			scenario{where + ", 8 MiB contiguous, GPU doorbell", rd, 1, gpu.CopierOptions{Doorbell: gpu.DoorbellGPU}},
			scenario{where + ", 8 MiB contiguous, CPU doorbell", rd, 1, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU}},
			scenario{where + ", 64 × 128 KiB, batch", rd, 64, gpu.CopierOptions{}},
			scenario{where + ", 64 × 128 KiB, per entry", rd, 64, gpu.CopierOptions{Copy: gpu.CopyPerEntry}},
		)
		if rd == 0 {
			break
		}
	}
	runtime.LockOSThread()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var rows []row
	for _, sc := range runs {
		dir, err := os.MkdirTemp(*shm, "pxn-gpucheck-")
		if err != nil {
			return err
		}
		cfg := ringcheck.Config{
			RelayDevice: sc.relayDev, SenderDevice: 0, ControlPath: dir + "/control",
			Lane: 0, Pieces: *warm + *pieces, PieceLen: staging.SlotSize, Entries: sc.entries, Timeout: *timeout,
		}
		r, err := measure(d, exe, cfg, *warm, *pieces, sc.opts)
		os.RemoveAll(dir)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		r.scenario = sc.name
		rows = append(rows, r)
	}
	fmt.Printf("pxn-gpucheck ring: driver %d, %d devices, %d Pieces of %d bytes per row (after %d warm-up); baseline = raw cuMemcpyAsync of the same Pieces, one stream, same processes\n",
		d.Version(), n, *pieces, staging.SlotSize, *warm)
	tw := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tbytes\tpieces\tGB/s\tµs/piece\tbaseline GB/s\tratio\tcopier")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.2f\t%.1f\t%.3f\t%s\n", r.scenario, r.bytes, r.pieces,
			gbps(r.bytes, r.ring), float64(r.ring.Microseconds())/float64(r.pieces), gbps(r.bytes, r.raw),
			r.raw.Seconds()/r.ring.Seconds(), r.note)
	}
	return tw.Flush()
}

// measure runs one relay: raw copies, the warm-up, the measured ring, raw
// copies again; the baseline is the faster raw run.
func measure(d *cuda.Driver, exe string, cfg ringcheck.Config, warm, pieces int, opts gpu.CopierOptions) (row, error) {
	rp, err := ringcheck.StartRelay(exe, nil, cfg)
	if err != nil {
		return row{}, err
	}
	s, err := ringcheck.NewSender(d, cfg, rp.Handle, opts)
	if err != nil {
		rp.Kill()
		return row{}, err
	}
	var r row
	var errs []error
	raw1, err := s.Raw(pieces)
	errs = append(errs, err)
	if err == nil {
		_, err = s.Run(warm)
		errs = append(errs, err)
	}
	if err == nil {
		r.ring, err = s.Run(pieces)
		errs = append(errs, err)
	}
	raw2, err := s.Raw(pieces)
	errs = append(errs, err)
	r.raw = min(raw1, raw2)
	r.pieces = pieces
	r.bytes = uint64(pieces) * uint64(cfg.PieceLen)
	r.note = fmt.Sprintf("%v, %s", s.Copier().CopyMode(), s.Copier().Doorbell())
	errs = append(errs, s.Close(), rp.Wait())
	return r, errors.Join(errs...)
}
