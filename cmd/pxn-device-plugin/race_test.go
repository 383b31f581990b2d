// SPDX-License-Identifier: Apache-2.0

//go:build race

package main_test

const raceEnabled = true
