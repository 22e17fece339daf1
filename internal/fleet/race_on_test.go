//go:build race

package fleet

// raceEnabled: the race detector slows every memory access several times,
// so a rate is not judged under it (only G1).
const raceEnabled = true
