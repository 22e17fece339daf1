package api

import "time"

// LaneHistory is a lane's throughput over the last minutes, oldest sample
// first (GET /v1/lanes/{lane}/history): what the status page draws.
type LaneHistory struct {
	Lane string `json:"lane"`
	// IntervalSeconds is the time between two samples.
	IntervalSeconds float64 `json:"interval_seconds"`
	// Samples are at most the last ten minutes' worth, oldest first.
	Samples []LaneSample `json:"samples"`
}

// LaneSample is one point of a LaneHistory.
type LaneSample struct {
	At time.Time `json:"at"`
	// StartsPerSecond is the jobs this instance started in the interval
	// ending at At, per second.
	StartsPerSecond float64 `json:"starts_per_second"`
	// Backlog is the lane's jobs stored and not done at At, all instances
	// (JetStream's count, at most an interval old); nil when JetStream
	// could not be read.
	Backlog *uint64 `json:"backlog"`
}
