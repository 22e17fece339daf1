package redisbucket

// Calls is the number of script calls s has made (successful or not); a
// call that had to fall back from EVALSHA to EVAL counts once.
func Calls(s *Store) uint64 { return s.calls.Load() }
