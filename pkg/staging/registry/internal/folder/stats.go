// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"golang.org/x/sys/unix"
)

// ErrStatsBusy means a rank's counters block changed under every attempt to
// copy it (or a hostile writer keeps its sequence word odd).
var ErrStatsBusy = errors.New("counters block busy")

// Attempts of a stats read: statsSpins back to back, then statsNaps apart
// by statsNap. A publish takes well under a microsecond; the naps ride out
// a pump thread descheduled in the middle of one.
const (
	statsSpins = 16
	statsNaps  = 20
	statsNap   = 500 * time.Microsecond
)

// StatsEnd is where the counters block ends in a control file: the part a
// stats reader maps.
const StatsEnd = unsafe.Offsetof(staging.ControlBlock{}.Stats) + unsafe.Sizeof(staging.RankStats{})

// ReadStats copies the counters block of the control file open as fd,
// whose size the caller has checked. It maps the file's first page read
// only: the block's sequence lock needs atomic loads, which a read(2)
// cannot promise on every CPU. It takes no lock and writes nothing.
func ReadStats(fd int) (staging.RankStats, error) {
	mem, err := unix.Mmap(fd, 0, int(StatsEnd), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return staging.RankStats{}, fmt.Errorf("map the counters block: %w", err)
	}
	defer unix.Munmap(mem)
	return LoadStats((*staging.RankStats)(unsafe.Pointer(&mem[unsafe.Offsetof(staging.ControlBlock{}.Stats)])))
}

// LoadStats copies a mapped counters block with bounded retries. A file
// truncated under the mapping faults instead of reading: that fault becomes
// an error.
func LoadStats(block *staging.RankStats) (st staging.RankStats, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: counters block unreadable (file truncated?): %v", ErrCorruptEntry, r)
		}
	}()
	for i := range statsSpins + statsNaps {
		if block.Load(&st) {
			return st, nil
		}
		if i < statsSpins {
			runtime.Gosched()
		} else {
			time.Sleep(statsNap)
		}
	}
	return staging.RankStats{}, ErrStatsBusy
}
