// SPDX-License-Identifier: Apache-2.0

//go:build !race

package relay_test

const raceEnabled = false
