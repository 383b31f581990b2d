//go:build race

package staging

const raceEnabled = true
