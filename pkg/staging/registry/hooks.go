// SPDX-License-Identifier: Apache-2.0

package registry

import "time"

// hooks let the package's tests fail an init step and watch Close wait for
// leases. A production rank has none, so each use costs one nil check.
type hooks struct {
	// beforeStep, when set, runs before each init step; an error it
	// returns fails that step, as the step's own error would.
	beforeStep func(InitStep) error
	// leaseWait, when set, is told which lanes are still held each time
	// Close looks, and returns how long Close waits before it looks again.
	leaseWait func(held []int) time.Duration
}
