package records

import "github.com/throttler/throttler/api"

// EncodeForBench is encode, for the benchmarks of package records_test.
func EncodeForBench(rec api.JobRecord) ([]byte, error) { return encode(rec) }
