// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
)

// RunOptions are run's flags.
type RunOptions struct {
	Device  string
	Ranks   int
	Bytes   uint64
	Block   uint64
	Pattern string
	JSON    string
	Credit  string
	// PerSubmit is the number of requests per Submit (0: the device's
	// default).
	PerSubmit int
	CUDA      CUDAOptions
	KV        KVOptions
	// RegistryRoot is the folder the ranks' registry folder is made in.
	RegistryRoot string
	// RailMap, when set, names the ranks' HCAs and rails after a node's
	// (nodeRails); nil: mlx5_k on railk.
	RailMap map[string]string
	// AllocPass repeats the engine phase's transfer once more, only to
	// count heap allocations in steady state.
	AllocPass bool
	// FirstPiece is the ranks' MC_PXN_FIRST_PIECE_KIB ("": the engine's
	// default).
	FirstPiece string
	// SlotParts is the ranks' MC_PXN_SLOT_PARTS (0: the engine's default).
	SlotParts int
	Out       io.Writer
	// ErrOut takes warnings; Getenv reads this process's environment.
	ErrOut io.Writer
	Getenv func(string) string
	// PIDNS starts each rank in a PID and mount namespace of its own.
	PIDNS bool
	// HoldAfter keeps the engine phase's ranks registered, idle, for this
	// long after their last step, so that a scraper sees their counters.
	HoldAfter time.Duration
}

// CUDAOptions are run's flags for --device cuda.
type CUDAOptions struct {
	Suite     string
	GPUs      string
	Rate      float64
	Raw       bool
	Latency   int
	GatherPTX string
	CopyMode  string
	// NoInlinePlan makes the ranks' copiers upload every gather plan
	// (gpu.CopierOptions.NoInlinePlan).
	NoInlinePlan bool
	// PollSpin and PollNap replace the pump's poll policy (zero: the
	// copier's default), to measure the trade-off of CPU and latency.
	PollSpin, PollNap time.Duration
	// ArenaShare is how each rank shares its device arena (auto, fd, ipc).
	ArenaShare string
}

// Check checks what run's options say before any work starts: the device,
// the rank count, the pattern and the JSON file. The error names the flag
// and its value.
func (o RunOptions) Check() error {
	if o.Device != "host" && o.Device != "cuda" {
		return fmt.Errorf("--device %q: want host or cuda", o.Device)
	}
	if o.CUDA.Suite == "" {
		if o.Ranks < 2 || o.Ranks > 8 {
			return fmt.Errorf("--ranks %d: want 2..8 (one rank per GPU of a node)", o.Ranks)
		}
		if !slices.Contains(Patterns, o.Pattern) {
			return patternError(o.Pattern)
		}
		if o.Pattern != "kv" && o.Bytes == 0 {
			return fmt.Errorf("--bytes must be > 0")
		}
		if _, _, err := nodeRails(o.Ranks, o.RailMap); err != nil {
			return err
		}
		if o.Pattern == "kv" {
			if o.CUDA.Raw || o.CUDA.Latency > 0 || o.AllocPass {
				return fmt.Errorf("--pattern kv: --raw, --latency and --alloc-pass time other traffic; the kv rows time each request")
			}
			if _, err := newKVLayout(o.Ranks, o.KV); err != nil {
				return err
			}
		}
	}
	if err := o.checkEngine(); err != nil {
		return err
	}
	if o.JSON != "" {
		return CheckOutput("--json", o.JSON)
	}
	return nil
}

// engineFlags names run's flag for each MC_PXN_* variable of rankEnv.
var engineFlags = map[string]string{
	contract.EnvCreditTimeout: "--credit-timeout",
	contract.EnvCopyMode:      "--copy-mode",
	contract.EnvFirstPiece:    "--first-piece",
	contract.EnvSlotParts:     "--slot-parts",
}

// checkEngine reads the ranks' engine settings with the engine's own
// parser, so that a value a rank's engine would refuse is refused here,
// before any process starts, naming the flag and the value.
func (o RunOptions) checkEngine() error {
	env := map[string]string{contract.EnvEnable: contract.EnableOn, contract.EnvGroupID: "bench-pxn"}
	for _, kv := range o.rankEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	_, errs := engineconfig.FromEnv(func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	var bad []any
	for _, err := range errs {
		var e *engineconfig.EnvError
		if errors.As(err, &e) && engineFlags[e.Var] != "" {
			err = fmt.Errorf("%s %s: %w (%s for the ranks)", engineFlags[e.Var], contract.Quote(e.Value), e.Err, e.Var)
		} else {
			err = fmt.Errorf("the ranks' engine settings: %w", err)
		}
		bad = append(bad, err)
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf(strings.Repeat("; %w", len(bad))[2:], bad...)
}

// rankEnv are the MC_PXN_* settings the flags give every rank beyond what
// a scenario sets itself.
func (o RunOptions) rankEnv() []string {
	var e []string
	if o.Credit != "" {
		e = append(e, contract.EnvCreditTimeout+"="+o.Credit)
	}
	if o.CUDA.CopyMode != "" {
		e = append(e, contract.EnvCopyMode+"="+o.CUDA.CopyMode)
	}
	if o.FirstPiece != "" {
		e = append(e, contract.EnvFirstPiece+"="+o.FirstPiece)
	}
	if o.SlotParts != 0 {
		e = append(e, contract.EnvSlotParts+"="+strconv.Itoa(o.SlotParts))
	}
	return e
}

// rankSettings names, for the rows, what the flags changed in the ranks'
// engines ("" for the defaults).
func (o RunOptions) rankSettings() string {
	e := o.rankEnv()
	if o.CUDA.PollSpin != 0 || o.CUDA.PollNap != 0 {
		e = append(e, "poll spin "+o.CUDA.PollSpin.String()+", nap "+o.CUDA.PollNap.String())
	}
	if o.CUDA.NoInlinePlan {
		e = append(e, "every gather plan uploaded")
	}
	return strings.Join(e, " ")
}
