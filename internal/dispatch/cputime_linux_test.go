package dispatch

import (
	"syscall"
	"testing"
)

// threadCPU is the CPU time (user and system) of the calling thread, in
// nanoseconds; the caller locks its goroutine to the thread.
func threadCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
