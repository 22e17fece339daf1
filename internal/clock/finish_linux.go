package clock

import (
	"syscall"
	"time"
)

// canFinish: finish sleeps in the kernel.
const canFinish = true

// finish sleeps until end with nanosleep, whose wake-up is an hrtimer's
// (the thread's timer slack, 50 µs by default, plus the scheduler), not the
// netpoller's millisecond. A signal (the runtime's preemption) cuts a sleep
// short: it sleeps again for what is left.
func finish(end time.Time) {
	for {
		left := time.Until(end)
		if left <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(left.Nanoseconds())
		_ = syscall.Nanosleep(&ts, nil)
	}
}
