// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/internal/sim/ringcheck"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
)

// firsthopMode is one way of moving a Piece in the P2 runs.
type firsthopMode struct {
	name string
	opts gpu.CopierOptions
}

// FirsthopOptions are the P2 ring's flags, set by run --suite p2: the
// relay's and the sender's GPU, the entry sizes and SM launch shapes (comma
// lists), the timed and the verified warm-up Pieces per mode, and the
// gather kernel's PTX file ("": the embedded one).
type FirsthopOptions struct {
	RelayGPU, SenderGPU int
	Sizes, Shapes       string
	Pieces, Warm        int
	GatherPTX           string
}

// FirsthopMain measures P2: the first hop alone, through a real
// two-process ring (ringcheck: an 18-slot lane, doorbells, credit), for
// Pieces of 8 MiB cut into entries of one size, moved by the copy engines'
// batch copy, by the SM gather kernel and by the automatic choice, each
// against a raw contiguous copy-engine copy of 8 MiB Pieces in the same
// processes. The first warm-up Pieces of every mode are checked byte for
// byte by the relay process; the timed ones are not.
func FirsthopMain(o FirsthopOptions) int {
	rows, err := runFirsthop(o.RelayGPU, o.SenderGPU, o.Sizes, o.Shapes, o.Pieces, o.Warm, o.GatherPTX)
	if err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	emit(event{Event: "rows", Rows: rows})
	return 0
}

func runFirsthop(relayGPU, senderGPU int, sizeList, shapeList string, pieces, warm int, ptxPath string) ([]Row, error) {
	runtime.LockOSThread()
	var ptx []byte
	if ptxPath != "" {
		var err error
		if ptx, err = os.ReadFile(ptxPath); err != nil {
			return nil, err
		}
	}
	modes := []firsthopMode{{name: "CE batch", opts: gpu.CopierOptions{Gather: gpu.GatherCE}}}
	for i, s := range strings.Split(shapeList, ",") {
		var b, t, st int
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%dx%dx%d", &b, &t, &st); err != nil || b <= 0 || st <= 0 || b*st > gpu.GatherMaxBlocks {
			return nil, fmt.Errorf("--shapes %q: want blocks x threads x streams, at most %d blocks in all", shapeList, gpu.GatherMaxBlocks)
		}
		name := fmt.Sprintf("SM %d×%d on %d stream(s)", b, t, st)
		if i == 0 {
			name += " (default)"
		}
		modes = append(modes, firsthopMode{name: name, opts: gpu.CopierOptions{Gather: gpu.GatherSM, GatherBlocks: b, GatherThreads: t, GatherStreams: st}})
	}
	modes = append(modes, firsthopMode{name: "auto", opts: gpu.CopierOptions{Gather: gpu.GatherAuto}})
	for i := range modes {
		modes[i].opts.GatherPTX = ptx
	}
	d, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	shm, err := os.MkdirTemp("/dev/shm", "pxn-bench-ring-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(shm)
	var rows []Row
	for _, s := range strings.Split(sizeList, ",") {
		size, err := ParseSize(s)
		if err != nil || size == 0 || staging.SlotSize%size != 0 || staging.SlotSize/size > staging.MaxPlans {
			return rows, fmt.Errorf("--sizes: %q does not cut an 8 MiB Piece into at most %d equal entries", s, staging.MaxPlans)
		}
		cfg := ringcheck.Config{
			RelayDevice: relayGPU, SenderDevice: senderGPU,
			ControlPath: filepath.Join(shm, "control-"+strconv.FormatUint(size, 10)),
			Lane:        2, Pieces: len(modes) * (warm + pieces), PieceLen: staging.SlotSize, Entries: int(staging.SlotSize / size),
			Verify: true, VerifyPeriod: warm + pieces, VerifyCount: warm, Timeout: 5 * time.Minute,
		}
		rs, err := firsthopSize(d, exe, cfg, modes, warm, pieces)
		rows = append(rows, rs...)
		if err != nil {
			return rows, fmt.Errorf("%s entries: %w", sizeString(size), err)
		}
	}
	return rows, nil
}

func firsthopSize(d *cuda.Driver, exe string, cfg ringcheck.Config, modes []firsthopMode, warm, pieces int) (rows []Row, err error) {
	rp, err := ringcheck.StartRelay(exe, nil, cfg)
	if err != nil {
		return nil, err
	}
	s, err := ringcheck.NewSender(d, cfg, rp.Handle, modes[0].opts)
	if err != nil {
		rp.Kill()
		return nil, err
	}
	defer func() {
		cerr := s.Close()
		if err != nil {
			rp.Kill()
			return
		}
		if err = errors.Join(cerr, rp.Wait()); err == nil {
			for i := range rows {
				rows[i].Verified = true
			}
		}
	}()
	if _, err := s.Raw(warm); err != nil {
		return nil, err
	}
	rawT, err := s.Raw(pieces)
	if err != nil {
		return nil, err
	}
	bytes := uint64(pieces) * staging.SlotSize
	raw := gbpsOf(bytes, rawT.Seconds())
	size := staging.SlotSize / uint64(cfg.Entries)
	for i, m := range modes {
		if i > 0 {
			if err := s.SwitchCopier(m.opts); err != nil {
				return rows, fmt.Errorf("%s: %w", m.name, err)
			}
		}
		if _, err := s.Run(warm); err != nil {
			return rows, fmt.Errorf("%s: %w", m.name, err)
		}
		t, err := s.Run(pieces)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", m.name, err)
		}
		st, gi := s.Copier().Stats(), s.Copier().Gather()
		r := Row{
			Scenario: fmt.Sprintf("P2 first hop, 8MiB Pieces of %d × %s entries, %s", cfg.Entries, sizeString(size), m.name),
			Bytes:    bytes, Pieces: uint64(pieces), GBps: gbpsOf(bytes, t.Seconds()), USPerPiece: t.Seconds() * 1e6 / float64(pieces),
			Baseline: "raw CE copy, 8MiB contiguous", BaselineGBps: raw,
			Note: fmt.Sprintf("%d of %d Pieces by the SM kernel (%d×%d, %d stream(s)); GPU %d → GPU %d", st.SMPieces, st.Copies, gi.Grid, gi.Block, gi.Streams, cfg.SenderDevice, cfg.RelayDevice),
		}
		r.Ratio = r.GBps / raw
		rows = append(rows, r)
	}
	rows = append(rows, Row{Scenario: fmt.Sprintf("P2 baseline for %s entries: raw CE copy, 8MiB contiguous", sizeString(size)), Bytes: bytes,
		Pieces: uint64(pieces), GBps: raw, USPerPiece: rawT.Seconds() * 1e6 / float64(pieces)})
	return rows, nil
}
