// SPDX-License-Identifier: Apache-2.0

//go:build !race

package engineopen_test

const raceEnabled = false
