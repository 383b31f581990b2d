// SPDX-License-Identifier: Apache-2.0

//go:build race

package engineopen_test

// raceEnabled: the race detector allocates on its own, so allocation
// counts mean nothing under it.
const raceEnabled = true
