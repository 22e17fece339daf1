package testenv

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, and fails t (t.Fatalf, naming what
// it waited for) when it still does not after within. It is the suite's one
// way to wait for a condition: a test polls for what it expects instead of
// sleeping for a guessed time. cond runs on the calling goroutine; a cond
// that does I/O should bound it (an HTTP client with a timeout) so that the
// deadline holds.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := poll(within, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}); err != nil {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// EventuallyNil is Eventually for a check that says why it does not hold
// yet: it polls check until it returns nil, and fails t with check's last
// error after within.
func EventuallyNil(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	if err := poll(within, check); err != nil {
		t.Fatalf("timed out after %v waiting for %s: %v", within, what, err)
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}

// poll calls check until it returns nil or within passes, and returns its
// last error then.
func poll(within time.Duration, check func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollEvery)
	}
}
