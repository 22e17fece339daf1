//go:build race

package bench

// raceEnabled: the race detector slows every memory access several times,
// so the scenarios that drain at the highest rate are not run under it.
const raceEnabled = true
