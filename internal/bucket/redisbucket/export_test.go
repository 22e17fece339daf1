package redisbucket

import (
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// Calls is the number of script calls s has made (successful or not); a
// call that had to fall back from EVALSHA to EVAL counts once.
func Calls(s *Store) uint64 { return s.calls.Load() }

// FloorAhead is how much longer s sends k's floor (zero when it has none).
func FloorAhead(s *Store, k bucket.Key) time.Duration {
	s.floors.mu.Lock()
	defer s.floors.mu.Unlock()
	e, ok := s.floors.m[s.Key(k)]
	if !ok {
		return 0
	}
	return time.Until(e.until)
}

// AdmitScript and PairScript are the scripts behind Admit and ReservePair,
// for tests that call them with arguments of their own.
var AdmitScript, PairScript = admitScript, pairScript
