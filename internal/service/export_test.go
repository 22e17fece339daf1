package service

import "time"

// SetQueueStatsEvery sets how often the lanes' JetStream-derived gauges are
// read (the external tests' metrics wait for them in 100 ms, not seconds).
func SetQueueStatsEvery(s *Service, d time.Duration) { s.queueStatsEvery = d }

// SetHistoryEvery sets the lanes' throughput sampling interval.
func SetHistoryEvery(s *Service, d time.Duration) { s.historyEvery = d }
