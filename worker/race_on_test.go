//go:build race

package worker_test

// raceEnabled: the race detector slows every memory access several times,
// so speed is not measured under it (only correctness).
const raceEnabled = true
