//go:build !unix

package records_test

import "time"

// cpuTime is 0 where getrusage is missing: the benchmark reports no CPU.
func cpuTime() time.Duration { return 0 }
