package config

import "math"

// The embedded server's memory, as measured (`throttler-bench --only rss`,
// docs/OPERATIONS.md "Memory of the embedded server"): JetStream's
// de-duplication index costs 220–233 B per job id stored within
// nats.dedup_window, rounded up to DedupIDBytes; the rest of the process
// took 53–71 MB with a million jobs waiting and no ids, and 84 MB after
// taking 100,000 jobs and refusing 900,000, rounded up to EmbeddedBaseBytes.
// EmbeddedMemoryWarn is where an instance whose lanes could reach more says
// so at start.
const (
	EmbeddedBaseBytes  = 85_000_000
	DedupIDBytes       = 230
	EmbeddedMemoryWarn = 150_000_000
)

// DedupIDs bounds the job ids the streams of c's lanes can hold in their
// de-duplication index at once. Per lane: the jobs that may wait
// (max_backlog), plus twice the jobs that may start within one
// nats.dedup_window (burst + rate × window): every job stored within the
// window either still waits or has started, and each start may store one
// more id, a retry copy (which comes back into the lane as one of the jobs
// stored) or a dead letter. Replays an operator asks for, and rates raised
// at runtime (PATCH), come on top.
func (c *Config) DedupIDs() int64 {
	window := c.NATS.DedupWindow.D().Seconds()
	var ids float64
	for _, l := range c.Lanes {
		started := float64(l.Burst) + math.Ceil(l.Rate.PerSecond()*window)
		ids += float64(l.MaxBacklog) + 2*started
	}
	return int64(min(ids, math.MaxInt64/2))
}

// EmbeddedMemory is the resident memory an instance running the embedded
// server may reach with c's lanes at their bounds (DedupIDs): the measured
// base plus DedupIDBytes per id. With an external NATS (nats.url) that
// memory is the NATS server's, not the throttler's.
func (c *Config) EmbeddedMemory() int64 {
	ids := c.DedupIDs()
	if ids > (math.MaxInt64-EmbeddedBaseBytes)/DedupIDBytes {
		return math.MaxInt64
	}
	return EmbeddedBaseBytes + DedupIDBytes*ids
}
