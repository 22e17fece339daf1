//go:build !linux

package dispatch

import "testing"

// threadCPU is 0 where the thread's own CPU time is not read: cpu-ns/op
// then says 0.
func threadCPU(*testing.B) int64 { return 0 }
