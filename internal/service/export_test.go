package service

import "time"

// SetQueueStatsEvery sets how often the lanes' JetStream-derived gauges are
// read (the external tests' metrics wait for them in 100 ms, not seconds).
func SetQueueStatsEvery(s *Service, d time.Duration) { s.queueStatsEvery = d }

// SetHistoryEvery sets the lanes' throughput sampling interval.
func SetHistoryEvery(s *Service, d time.Duration) { s.historyEvery = d }

// SetMaxWaiters bounds the requests waiting for their jobs' answers
// (?wait=) on s; a caller may hold a quarter of them. Call it before Run.
func SetMaxWaiters(s *Service, n int) { s.maxWaiters = n }
