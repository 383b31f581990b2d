// SPDX-License-Identifier: Apache-2.0

//go:build !race

package hostengine_test

const raceEnabled = false
