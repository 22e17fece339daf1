package config

import (
	"math"
	"strconv"
)

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

// StreamBytes is the file storage JetStream reserves for c's streams when
// it creates them (one replica's worth): each lane's max_bytes, twice for a
// keyed lane (its intake stream and its store), and the retry and
// dead-letter streams' max_bytes. The embedded server refuses a stream
// that would take the reservations beyond three quarters of the disk free
// at nats.data_dir when it started.
func (c *Config) StreamBytes() int64 {
	sum := addSat(int64(c.Retries.MaxBytes), int64(c.DeadLetters.MaxBytes))
	for _, l := range c.Lanes {
		sum = addSat(sum, int64(l.MaxBytes))
		if l.PerKey != nil {
			sum = addSat(sum, int64(l.MaxBytes))
		}
	}
	return sum
}

// addSat is a + b for sizes (never negative), at most math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// String writes b as the YAML takes it, in the largest unit it reaches:
// "1GiB", "512KiB", or with one decimal when the unit does not divide it
// ("58.4GiB", which the YAML does not take).
func (b ByteSize) String() string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		switch {
		case int64(b) < u.size:
			continue
		case int64(b)%u.size == 0:
			return strconv.FormatInt(int64(b)/u.size, 10) + u.suffix
		default:
			return strconv.FormatFloat(float64(b)/float64(u.size), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
